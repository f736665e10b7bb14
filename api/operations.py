"""What each ``/v1`` operation accepts and answers, declared once: ``api.framework.route``
takes these declarations beside its methods, the views parse with the same ``Body`` and
``Query`` objects (``api.params``), and ``api.openapi`` describes the API from them.

A route given a bare method string is still served and still described (its path, its
method, the errors every route can answer); its answer is then described only as a JSON
object, until the view declares an :class:`Operation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.framework import Body
from api.params import Query

JSONSchema = Mapping[str, Any]


@dataclass(frozen=True)
class Answer:
    """One status an operation answers with something other than the ``/v1`` error shape:
    a description and the JSON Schema of its body (``None``: no body)."""

    description: str
    schema: JSONSchema | None = None
    content_type: str = "application/json"
    headers: Mapping[str, JSONSchema] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """One method of one route.

    - ``summary``: one line for the description.
    - ``body``: the JSON body it parses; ``query``: the query string it takes
      (``api.params.Query``, the object ``takes_query`` validates with; a list's includes
      its paging).
    - ``answers``: the JSON Schema of its 200 answer (``api.schemas``).
    - ``errors``: status -> the codes a view or its service may refuse with, beyond what
      ``route`` answers for every operation (``api.openapi`` adds those).
    - ``public``: no credential (the description itself).
    - ``responses``: the whole set of answers, for a view that is not wrapped by ``route``
      and so does not answer in the ``/v1`` error shape (the OAuth token endpoint);
      ``form`` is then its form-encoded body.
    - ``operation_id``: a generated client's name for it, when the path's is wrong.
    """

    method: str
    summary: str = ""
    body: Body | None = None
    query: Query | None = None
    answers: JSONSchema | None = None
    errors: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    public: bool = False
    responses: Mapping[int, Answer] | None = None
    form: Body | None = None
    description: str = ""
    operation_id: str = ""  # else derived from the method and path (api.openapi.operation_id)


def describe(*operations: Operation):
    """Attach declarations to a view that ``route`` does not wrap (``api.oauth.token``,
    ``api.openapi_view``), so the description finds them as it finds routed views'."""

    def decorate(view):
        view.operations = operations
        return view

    return decorate
