"""Declared query parameters: what a ``GET`` accepts in its query string, the way ``Body``
declares what a POST accepts (``api.framework``).

A view declares its :class:`Query` with :func:`takes_query`; the query string is parsed
and validated before the view runs (unknown names, repeats, bad values: a 400 naming the
parameter) and the cleaned values are on ``request.query``. The declaration stays on the
view as ``view.query``, where the API description reads it (:meth:`Query.openapi`), so what
is validated and what is described are one thing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse

from api.framework import DEFAULT_PAGE, MAX_PAGE, ApiError
from api.ids import ID_MAX_LENGTH

_OPENAPI_TYPES = {str: "string", int: "integer"}
_INTEGER = re.compile(r"-?[0-9]{1,18}")


@dataclass(frozen=True)
class Param:
    """One query parameter: a string or an integer, given once, or ``repeated`` (its name
    ends in ``[]``: ``?types[]=a&types[]=b``), each value within the bounds."""

    type: type = str
    description: str = ""
    repeated: bool = False
    max_items: int = 50
    max_length: int | None = None
    min_value: int | None = None
    max_value: int | None = None
    choices: Iterable[str] | None = None

    def clean(self, name: str, values: list[str]) -> Any:
        if not self.repeated and len(values) != 1:
            raise ApiError(400, "parameter_invalid", f"{name} may be given once.", param=name)
        if len(values) > self.max_items:
            raise ApiError(400, "parameter_invalid", f"{name} may be given at most {self.max_items} times.", param=name)
        cleaned = [self._one(name, value) for value in values]
        return cleaned if self.repeated else cleaned[0]

    def _one(self, name: str, value: str) -> Any:
        if self.type is int:
            # int() alone would take " 7", "+7" and "7_000": a bound is plain digits.
            if not _INTEGER.fullmatch(value):
                raise ApiError(400, "parameter_invalid_type", f"{name} must be an integer.", param=name)
            value = int(value)
        elif not value:
            raise ApiError(400, "parameter_invalid", f"{name} may not be empty.", param=name)
        if self.max_length is not None and len(value) > self.max_length:
            raise ApiError(400, "parameter_too_long", f"{name} is longer than {self.max_length}.", param=name)
        if self.min_value is not None and value < self.min_value:
            raise ApiError(400, "parameter_out_of_range", f"{name} must be at least {self.min_value}.", param=name)
        if self.max_value is not None and value > self.max_value:
            raise ApiError(400, "parameter_out_of_range", f"{name} must be at most {self.max_value}.", param=name)
        if self.choices is not None and value not in self.choices:
            raise ApiError(400, "parameter_invalid", f"{name}: unknown value {value!r}.", param=name)
        return value

    def schema(self) -> dict:
        """The JSON Schema of the parameter's value (OpenAPI 3.1)."""
        one: dict[str, Any] = {"type": _OPENAPI_TYPES[self.type]}
        for key, bound in (("maxLength", self.max_length), ("minimum", self.min_value), ("maximum", self.max_value)):
            if bound is not None:
                one[key] = bound
        if self.choices is not None:
            one["enum"] = sorted(self.choices)
        if self.repeated:
            return {"type": "array", "items": one, "maxItems": self.max_items}
        return one


class Query:
    """The query parameters a GET accepts; any other name is a 400 ``parameter_unknown``.

    ``exclusive`` pairs may not be given together (a 400 naming the second of the pair).
    """

    def __init__(self, params: Mapping[str, Param], *, exclusive: Iterable[tuple[str, str]] = ()) -> None:
        self.params = dict(params)
        self.exclusive = tuple(exclusive)

    def extend(self, params: Mapping[str, Param], *, exclusive: Iterable[tuple[str, str]] = ()) -> Query:
        """This query with more parameters (a list's filters beside its paging)."""
        return Query({**self.params, **params}, exclusive=(*self.exclusive, *exclusive))

    def parse(self, request: HttpRequest) -> dict[str, Any]:
        """The cleaned parameters present in the query string (absent ones are left out)."""
        cleaned: dict[str, Any] = {}
        for name in request.GET:
            param = self.params.get(name)
            if param is None:
                raise ApiError(400, "parameter_unknown", f"Received unknown parameter: {name}.", param=name)
            cleaned[name] = param.clean(name, request.GET.getlist(name))
        for first, second in self.exclusive:
            if first in cleaned and second in cleaned:
                raise ApiError(400, "parameter_invalid", f"Give {first} or {second}, not both.", param=second)
        return cleaned

    def openapi(self) -> list[dict]:
        """The parameters as OpenAPI 3.1 parameter objects (``in: query``)."""
        described = []
        for name, param in self.params.items():
            entry = {"name": name, "in": "query", "required": False, "schema": param.schema()}
            if param.description:
                entry["description"] = param.description
            if param.repeated:
                entry["style"], entry["explode"] = "form", True
            described.append(entry)
        return described


def takes_query(query: Query) -> Callable:
    """Declare a view's query parameters: a GET's query string is validated against ``query``
    before the view runs and its cleaned values are ``request.query``. Goes under ``route``
    (whose error handling answers the 400s). Other methods ignore the query string."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            request.query = query.parse(request) if request.method == "GET" else {}
            return view(request, *args, **kwargs)

        wrapper.query = query
        return wrapper

    return decorate


# --- lists ---------------------------------------------------------------------------

# The last whole second a datetime can hold (9999-12-31T23:59:59Z), less one: created[lte]
# is served as "before the next second".
CREATED_MAX = 253_402_300_798

LIST = Query(
    {
        "limit": Param(
            int, f"How many objects, 1 to {MAX_PAGE} (default {DEFAULT_PAGE}).", min_value=1, max_value=MAX_PAGE
        ),
        "starting_after": Param(
            str, "An object's id: the page of what comes after it, newest first.", max_length=ID_MAX_LENGTH
        ),
        "ending_before": Param(
            str, "An object's id: the page of what comes just before it, newest first.", max_length=ID_MAX_LENGTH
        ),
        "created[gte]": Param(
            int, "Only objects whose `created` is at or after this (unix seconds).", min_value=0, max_value=CREATED_MAX
        ),
        "created[lte]": Param(
            int, "Only objects whose `created` is at or before this (unix seconds).", min_value=0, max_value=CREATED_MAX
        ),
    },
    exclusive=[("starting_after", "ending_before")],
)
"""Every list's paging and ``created`` window (``api.lists.paginate`` applies them);
a list with filters declares ``LIST.extend({...})``."""
