"""Payload schemas: a small, strict validator for job payloads.

A payload is a JSON object with declared fields. Unknown fields, missing required
fields and wrong types are all errors: a payload that does not match its kind's schema
will never become valid, so it is refused at enqueue (nothing written) and, if one
reaches the table anyway, dead-lettered at claim with zero retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# JSON types by name. bool is excluded from int/float on purpose (True is an int in Python).
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


class PayloadError(ValueError):
    """A payload does not match its kind's schema."""


@dataclass(frozen=True)
class PayloadSchema:
    """Declared fields of a payload: ``{"name": "str" | "int" | "float" | "bool" | "list" | "dict"}``."""

    required: Mapping[str, str] = field(default_factory=dict)
    optional: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, type_name in {**self.required, **self.optional}.items():
            if type_name not in _TYPES:
                raise ValueError(f"field {name!r}: unknown type {type_name!r}")

    def validate(self, payload: object) -> None:
        """Raise :class:`PayloadError` naming the first problem found."""
        if not isinstance(payload, dict):
            raise PayloadError(f"payload must be a JSON object, not {type(payload).__name__}")
        unknown = sorted(set(payload) - set(self.required) - set(self.optional))
        if unknown:
            raise PayloadError(f"unknown field(s): {', '.join(unknown)}")
        for name in self.required:
            if name not in payload:
                raise PayloadError(f"missing required field {name!r}")
        for name, value in payload.items():
            type_name = self.required.get(name) or self.optional[name]
            if not _is_type(value, type_name):
                raise PayloadError(f"field {name!r} must be {type_name}, not {_json_type(value)}")


def _is_type(value: object, type_name: str) -> bool:
    if isinstance(value, bool) and type_name != "bool":
        return False
    return isinstance(value, _TYPES[type_name])


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(
        type(value), type(value).__name__
    )
