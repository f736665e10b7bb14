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
    # Set by __post_init__ (frozen: through object.__setattr__); not part of eq, hash or repr.
    _allowed: frozenset[str] = field(init=False, repr=False, compare=False)
    _required: frozenset[str] = field(init=False, repr=False, compare=False)
    _types: dict[str, tuple[tuple[type, ...], str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields_ = {**self.required, **self.optional}
        for name, type_name in fields_.items():
            if type_name not in _TYPES:
                raise ValueError(f"field {name!r}: unknown type {type_name!r}")
        # Precomputed once: validate() runs for every job enqueued and every job claimed.
        object.__setattr__(self, "_allowed", frozenset(fields_))
        object.__setattr__(self, "_required", frozenset(self.required))
        object.__setattr__(self, "_types", {name: (_TYPES[t], t) for name, t in fields_.items()})

    def validate(self, payload: object) -> None:
        """Raise :class:`PayloadError` naming the first problem found."""
        if not isinstance(payload, dict):
            raise PayloadError(f"payload must be a JSON object, not {type(payload).__name__}")
        keys = payload.keys()
        if not keys <= self._allowed:
            raise PayloadError(f"unknown field(s): {', '.join(sorted(keys - self._allowed))}")
        if not self._required <= keys:
            raise PayloadError(f"missing required field {sorted(self._required - keys)[0]!r}")
        types = self._types
        for name, value in payload.items():
            python_types, type_name = types[name]
            # bool is an int in Python, and never a valid int or float here.
            if not isinstance(value, python_types) or ((value is True or value is False) and type_name != "bool"):
                raise PayloadError(f"field {name!r} must be {type_name}, not {_json_type(value)}")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(
        type(value), type(value).__name__
    )
