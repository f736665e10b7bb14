"""The OpenAPI 3.1 description of ``/v1``, generated from the declarations the views
validate with: the URL resolver gives every route, ``api.framework.route`` (or
``api.operations.describe``) gives each one's ``Operation`` objects, and their ``Body``,
``Query`` and ``Field`` declarations, ``api.schemas`` and ``merchants.credentials.SCHEMES``
give the rest. Nothing here lists an endpoint: a new route is described by being routed.

``GET /v1/openapi.json`` serves it (``api.openapi_view``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

from api import schemas
from api.framework import MAX_IDEMPOTENCY_KEY, Body, Field
from api.operations import Answer, Operation
from api.schemas import Schema, ref
from merchants import credentials
from merchants.credentials import Kind
from vpay import api_version

_JSON_TYPES = {str: "string", int: "integer", bool: "boolean", dict: "object", list: "array"}
_CONVERTER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
_PATH_PARAMETER = {"type": "string", "minLength": 1, "pattern": "^[^/]+$"}  # Django's str converter

# What ``route`` answers for every operation, whatever its view does: status -> codes.
_EVERY_ROUTE = {
    # A Content-Length that is not a number, a Host not allowed; more query parameters than
    # DATA_UPLOAD_MAX_NUMBER_FIELDS.
    400: ("invalid_request", "too_many_parameters", "api_version_unknown"),
    401: credentials.REFUSAL_CODES,
    413: ("body_too_large",),
    429: ("rate_limited",),
    500: ("internal_error", "outcome_unknown"),  # the latter: a write whose link died (api.framework.route)
    503: ("database_unavailable",),
}
_BODY = {
    400: (
        "invalid_json",
        "parameter_unknown",
        "parameter_missing",
        "parameter_invalid",
        "parameter_invalid_type",
        "parameter_too_long",
        "parameter_out_of_range",
    ),
    415: ("unsupported_media_type",),
}
_POST = {
    400: ("idempotency_key_invalid",),
    409: ("idempotency_key_in_use", "idempotency_answer_unreadable", "idempotency_conflict"),
}
_LIST = {
    400: ("parameter_unknown", "parameter_invalid", "parameter_invalid_type", "parameter_out_of_range"),
    404: ("resource_missing",),  # starting_after names no object of the merchant's
}
_PATH = {404: ("resource_missing", "route_missing")}  # an id with a / in it matches no route
_REASONS = {
    400: "The request is malformed or a parameter is refused.",
    401: "No valid credential.",
    404: "No such object (or not this merchant's), or no such route.",
    409: "The object's state, or an Idempotency-Key, does not allow this request.",
    413: "The body is larger than VPAY_API_MAX_BODY_BYTES.",
    415: "The body is not application/json.",
    429: "Over the merchant's rate limit: wait Retry-After seconds.",
    500: "Our fault; the message says nothing about internals.",
    503: "Briefly unavailable (the database, a rail): retry after Retry-After seconds.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
# Every /v1 answer's (api.middleware).
_REQUEST_ID = {
    "Request-Id": {
        "description": "This request's id (req_…); an error body carries it as `request_id`.",
        "required": True,
        "schema": {"type": "string", "pattern": "^req_[A-Za-z0-9]{24}$"},
    }
}


def v1_routes() -> Iterator[tuple[str, Any]]:
    """Every route under ``/v1`` as (OpenAPI path, view), in resolution order."""

    def walk(patterns, prefix: str) -> Iterator[tuple[str, Any]]:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and (route == "v1" or route.startswith("v1/")):
                yield "/" + _CONVERTER.sub(r"{\g<name>}", route), pattern.callback

    yield from walk(get_resolver().url_patterns, "")


def described_routes() -> Iterator[tuple[str, Any]]:
    """The routes that declare operations (not the catch-all JSON 404)."""
    for path, view in v1_routes():
        if getattr(view, "operations", None):
            yield path, view


def field_schema(field: Field) -> Schema:
    """The JSON Schema of one declared field (its ``check`` says more in ``field.schema``)."""
    schema: Schema = {"type": _JSON_TYPES[field.type]}
    if field.max_length is not None:
        schema["maxItems" if field.type is list else "maxProperties" if field.type is dict else "maxLength"] = (
            field.max_length
        )
    if field.type is str and field.required:
        schema["pattern"] = r"\S"  # a required string may not be blank
    if field.min_value is not None:
        schema["minimum"] = field.min_value
    if field.max_value is not None:
        schema["maximum"] = field.max_value
    if field.choices is not None:
        schema["enum"] = list(field.choices)
    if field.items is not None:
        schema["items"] = {"type": _JSON_TYPES[field.items]}
    schema.update(field.schema or {})
    if field.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if field.description:
        schema["description"] = field.description
    return schema


def body_schema(body: Body) -> Schema:
    """A ``Body``: exactly its fields (an unknown one is a 400)."""
    return {
        "type": "object",
        "properties": {name: field_schema(field) for name, field in body.fields.items()},
        "required": [name for name, field in body.fields.items() if field.required],
        "additionalProperties": False,
    }


def _error(status: int, codes: tuple[str, ...]) -> Schema:
    listed = ", ".join(f"`{code}`" for code in sorted(set(codes)))
    answer: Schema = {
        "description": f"{_REASONS.get(status, 'Refused.')} Codes: {listed}.",
        "content": {"application/json": {"schema": ref("error")}},
    }
    answer["headers"] = {**_REQUEST_ID, **(_RETRY_AFTER if status in (429, 503) else {})}
    return answer


def _answer(answer: Answer) -> Schema:
    described: Schema = {"description": answer.description}
    if answer.schema is not None:
        described["content"] = {answer.content_type: {"schema": answer.schema}}
    if answer.headers:
        described["headers"] = {name: {"schema": schema} for name, schema in answer.headers.items()}
    return described


def _query(view: Any, op: Operation):
    """The query an operation takes: its own declaration, else the one the view validates
    a GET's query string with (``api.params.takes_query``): one object either way."""
    if op.query is not None:
        return op.query
    return getattr(view, "query", None) if op.method == "GET" else None


def _parameters(path: str, op: Operation, query) -> list[Schema]:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": dict(_PATH_PARAMETER)}
        for name in re.findall(r"{(\w+)}", path)
    ]
    if query is not None:
        parameters.extend(query.openapi())
    if op.responses is None:  # a routed operation (the token endpoint and the description are unversioned)
        parameters.append(
            {
                "name": api_version.HEADER,
                "in": "header",
                "required": False,
                "description": "The API version to answer in (a release date); the current one when absent.",
                "schema": ref("api_version"),
            }
        )
    if op.method == "POST" and op.responses is None:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Replays the first 2xx answer to the same request for 24 hours.",
                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
            }
        )
    return parameters


def _routed_responses(path: str, op: Operation, query) -> Schema:
    """Every status a ``route``-wrapped operation can answer."""
    codes: dict[int, list[str]] = {}
    sources = [_EVERY_ROUTE, op.errors]
    if op.body is not None:
        sources.append(_BODY)
    if op.method == "POST":
        sources.append(_POST)
    if query is not None and "limit" in query.params:
        sources.append(_LIST)
    if "{" in path:
        sources.append(_PATH)
    for source in sources:
        for status, listed in source.items():
            codes.setdefault(status, []).extend(listed)
    ok: Schema = {
        "description": "The object." if op.answers is not None else "A JSON object (not yet declared).",
        "content": {"application/json": {"schema": op.answers or {"type": "object"}}},
    }
    ok["headers"] = {
        **_REQUEST_ID,
        api_version.HEADER: {
            "description": "The API version the answer is in.",
            "required": True,
            "schema": ref("api_version"),
        },
    }
    if op.method == "POST":
        ok["headers"] |= {
            "Idempotent-Replayed": {
                "description": "`true` when this is a stored answer replayed for an Idempotency-Key.",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    responses = {"200": ok}
    for status in sorted(codes):
        responses[str(status)] = _error(status, tuple(codes[status]))
    return responses


def _singular(name: str) -> str:
    return name[:-3] + "y" if name.endswith("ies") else name.removesuffix("s")


def operation_id(method: str, path: str) -> str:
    """A generated client's name for an operation, from its method and path, as Stripe's
    libraries name them: ``list_events``, ``create_payment_intent``, ``retrieve_customer``,
    ``confirm_payment_intent`` (an action), ``list_webhook_endpoint_deliveries``."""
    parts = path.strip("/").split("/")[1:]
    owners: list[str] = []  # the objects the path names by id, singular
    literals: list[str] = []  # the segments since the last id
    for part in parts:
        if part.startswith("{"):
            owners.append(_singular("_".join(literals)))
            literals = []
        else:
            literals.append(part)
    owner, tail = "_".join(owners), "_".join(literals)
    if not tail:
        return {"GET": "retrieve", "POST": "update", "DELETE": "delete"}[method] + f"_{owner}"
    if not owner:
        return f"list_{tail}" if method == "GET" else f"create_{_singular(tail)}"
    return f"list_{owner}_{tail}" if method == "GET" else f"{tail}_{owner}"


def _operation(path: str, view: Any, op: Operation) -> Schema:
    doc = (view.__doc__ or "").strip()
    described: Schema = {
        "operationId": op.operation_id or operation_id(op.method, path),
        "tags": [path.split("/")[2].removesuffix(".json")],
        "summary": op.summary or doc.split("\n\n")[0].replace("\n", " ") or f"{op.method} {path}",
        "parameters": _parameters(path, op, _query(view, op)),
    }
    if op.description:
        described["description"] = op.description
    if op.body is not None and op.body.fields:
        described["requestBody"] = {
            "required": any(field.required for field in op.body.fields.values()),
            "content": {"application/json": {"schema": body_schema(op.body)}},
        }
    if op.form is not None:
        described["requestBody"] = {
            "required": True,
            "content": {"application/x-www-form-urlencoded": {"schema": body_schema(op.form)}},
        }
    if op.responses is not None:
        described["responses"] = {str(status): _answer(answer) for status, answer in sorted(op.responses.items())}
    else:
        described["responses"] = _routed_responses(path, op, _query(view, op))
    if op.public:
        described["security"] = []
    return described


def security_schemes() -> Schema:
    """``merchants.credentials.SCHEMES`` in OpenAPI's words."""
    described: Schema = {}
    for scheme in credentials.SCHEMES:
        if scheme.kind is Kind.SECRET_KEY:
            described[scheme.name] = {"type": "http", "scheme": "bearer", "description": scheme.description}
        elif scheme.kind is Kind.ACCESS_TOKEN:
            described[scheme.name] = {
                "type": "oauth2",
                "description": scheme.description,
                "flows": {"clientCredentials": {"tokenUrl": _token_url(), "scopes": {}}},
            }
    return described


def _token_url() -> str:
    from api.oauth import token_url

    return token_url()


def describe_api() -> Schema:
    """The whole description, as ``GET /v1/openapi.json`` answers it."""
    paths: Schema = {}
    for path, view in described_routes():
        for op in view.operations:
            paths.setdefault(path, {})[op.method.lower()] = _operation(path, view, op)
    merchant_credential = [{scheme.name: []} for scheme in credentials.SCHEMES if scheme.kind is not None]
    assertion = next(scheme for scheme in credentials.SCHEMES if scheme.kind is None)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vpay merchant API",
            "version": "v1",
            "description": (
                "Every 4xx and 5xx answers the `error` shape (the OAuth token endpoint answers RFC 6749's). "
                "A method a route does not take answers 405 `method_not_allowed` with `Allow`; a path no route "
                f"matches answers 404 `route_missing`. The token endpoint authenticates its client by a "
                f"`{assertion.name}`: {assertion.description}"
            ),
        },
        "servers": [{"url": settings.VPAY_PUBLIC_URL.rstrip("/")}],
        "security": merchant_credential,
        "paths": paths,
        "components": {"schemas": {**schemas.OBJECTS, "api_version": schemas.API_VERSION, "event_type_name": schemas.EVENT_TYPE_NAME}, "securitySchemes": security_schemes()},
    }
