"""The ``/v1`` API base: authentication, the one error format, request validation,
``Idempotency-Key`` and cursor pagination. Every ``/v1`` view is wrapped by :func:`route`.

Errors always have the shape ``{"error": {"type", "code", "message", "param", "request_id"}}``,
for every 4xx and 5xx, including the ones Django would otherwise answer in HTML.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import transaction
from django.db.models import Manager, Model, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import idempotency, ratelimit
from api.errors import API, AUTHENTICATION, IDEMPOTENCY, INVALID_REQUEST, http_of  # noqa: F401 - views import them from here
from api.storable import storable
from merchants.credentials import credential_authenticate
from vpay import api_version
from vpay.db_errors import connection_lost
from vpay.errors import DomainError, error_chain
from vpay.livemode import with_livemode
from vpay.request_context import current_request_id

if TYPE_CHECKING:
    from merchants.models import Merchant

logger = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY = 255
# Retry-After of a 503 database_unavailable: a restart or a failover takes seconds.
DATABASE_RETRY_AFTER_SECONDS = 2
DEFAULT_PAGE = 10
MAX_PAGE = 100


class ApiError(Exception):
    """A refusal, rendered in the common error format. ``message`` is for humans and
    must never contain a secret; ``code`` is for machines; ``param`` names the field."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        type: str = INVALID_REQUEST,
        retry_after: int | None = None,
        allow: Iterable[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param, self.type = status, code, message, param, type
        self.retry_after = retry_after  # seconds, sent as Retry-After (a 503 that will pass)
        self.allow = allow  # the methods a 405's route takes, sent as Allow (RFC 9110 §15.5.6)

    def response(self) -> JsonResponse:
        response = error_response(self.status, self.code, self.message, param=self.param, type=self.type)
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        if self.allow is not None:
            response["Allow"] = ", ".join(sorted(self.allow))
        return response

    @classmethod
    def of(cls, exc: DomainError) -> ApiError:
        """A service's refusal as the API answers it (``api.errors``)."""
        status, error_type = http_of(exc)
        retry_after = getattr(exc, "retry_after", None)  # RateLimited, Unavailable
        return cls(status, exc.code, exc.message, param=exc.param, type=error_type, retry_after=retry_after)


def error_response(
    status: int, code: str, message: str, *, param: str | None = None, type: str = INVALID_REQUEST
) -> JsonResponse:
    """The one error body every ``/v1`` 4xx and 5xx answers with."""
    error = {"type": type, "code": code, "message": message, "param": param}
    request_id = current_request_id()
    if request_id is not None:  # always under /v1 (api.middleware); the rails' callback has none
        error["request_id"] = request_id
    body = {"error": error}
    return JsonResponse(body, status=status)


def too_many_parameters() -> ApiError:
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    return ApiError(400, "too_many_parameters", f"At most {limit} parameters may be sent.")


def not_found(what: str, object_id: str) -> ApiError:
    """The same 404 whether the object does not exist or belongs to someone else."""
    return ApiError(404, "resource_missing", f"No such {what}: {object_id!r}.", param="id")


def unknown_version() -> ApiError:
    supported = ", ".join(api_version.SUPPORTED)
    return ApiError(
        400,
        "api_version_unknown",
        f"{api_version.HEADER} names no version of this API: send one of {supported}, or leave it out.",
    )


class ApiRequest(HttpRequest):
    """The request a ``/v1`` view receives, for the type checker only (never instantiated):
    :func:`route` sets ``merchant`` on Django's request and ``api.params.takes_query`` sets
    ``query``, attributes ``HttpRequest`` does not declare."""

    merchant: Merchant
    query: dict[str, Any]


M = TypeVar("M", bound=Model)


def owned(request: ApiRequest, queryset: QuerySet[M] | Manager[M], object_id: str, what: str) -> M:
    """The object ``object_id`` of ``queryset`` that belongs to the requesting merchant, or
    the 404 of :func:`not_found`: the one place the merchant-isolation rule is applied to a
    single-object lookup."""
    found = queryset.filter(merchant=request.merchant, id=object_id).first()
    if found is None:
        raise not_found(what, object_id)
    return found


def respond(payload: dict, status: int = 200) -> JsonResponse:
    """An answer; every object in it carries ``livemode`` (``vpay.livemode``)."""
    return JsonResponse(with_livemode(payload), status=status)


# --- request bodies ------------------------------------------------------------------


_UNSTORABLE = "may not contain NUL characters or unpaired surrogates."


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


@dataclass(frozen=True)
class Field:
    """One accepted body field: its JSON type and its bounds.

    ``check`` may refine a value; it returns the value to use or raises ``ValueError`` with a
    message for the client (the field name is added).
    """

    type: type
    required: bool = False
    nullable: bool = False
    max_length: int | None = None
    min_value: int | None = None
    max_value: int | None = None
    choices: Iterable[str] | None = None
    items: type | None = None
    check: Callable[[Any], Any] | None = None
    # For the API description (api.openapi): what the field is, and the JSON Schema
    # keywords that say what ``check`` enforces (a pattern, a format).
    description: str = ""
    schema: Mapping[str, Any] | None = None

    def clean(self, name: str, value: Any) -> Any:
        if not storable(value):
            raise ApiError(400, "parameter_invalid", f"{name} {_UNSTORABLE}", param=name)
        if value is None:
            if self.nullable:
                return None
            raise ApiError(400, "parameter_invalid", f"{name} may not be null.", param=name)
        # bool is an int in Python; JSON true is never an amount.
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise ApiError(400, "parameter_invalid_type", f"{name} must be {_TYPE_NAMES[self.type]}.", param=name)
        if self.max_length is not None and len(value) > self.max_length:
            raise ApiError(400, "parameter_too_long", f"{name} is longer than {self.max_length}.", param=name)
        if self.type is str and self.required and not value.strip():
            raise ApiError(400, "parameter_missing", f"{name} may not be blank.", param=name)
        if self.min_value is not None and value < self.min_value:
            raise ApiError(400, "parameter_out_of_range", f"{name} must be at least {self.min_value}.", param=name)
        if self.max_value is not None and value > self.max_value:
            raise ApiError(400, "parameter_out_of_range", f"{name} must be at most {self.max_value}.", param=name)
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(sorted(self.choices))
            raise ApiError(400, "parameter_invalid", f"{name} must be one of: {allowed}.", param=name)
        if self.items is not None:
            for i, item in enumerate(value):
                if not isinstance(item, self.items) or isinstance(item, bool):
                    raise ApiError(
                        400, "parameter_invalid_type", f"{name}[{i}] must be {_TYPE_NAMES[self.items]}.", param=name
                    )
        if self.check is not None:
            try:
                value = self.check(value)
            except ValueError as exc:
                raise ApiError(400, "parameter_invalid", f"{name}: {exc}", param=name) from None
        return value


def _metadata(value: dict) -> dict:
    if len(value) > 50:
        raise ValueError("at most 50 keys.")
    for key, item in value.items():
        if not key or len(key) > 40:
            raise ValueError("keys are 1 to 40 characters.")
        if not isinstance(item, str) or len(item) > 500:
            raise ValueError(f"the value of {key!r} must be a string of at most 500 characters.")
    return value


METADATA = Field(
    dict,
    check=_metadata,
    description="Up to 50 keys of 1 to 40 characters, each with a string value of at most 500 characters.",
    schema={
        "maxProperties": 50,
        "propertyNames": {"minLength": 1, "maxLength": 40},
        "additionalProperties": {"type": "string", "maxLength": 500},
    },
)
"""``metadata``: up to 50 string keys (40 chars) with string values (500 chars)."""


class Body:
    """The fields a POST accepts. Unknown fields, wrong types, bad JSON and oversize bodies
    are refused with a 400 that names the problem, before anything is written."""

    def __init__(self, **fields: Field) -> None:
        self.fields = fields

    def parse(self, request: HttpRequest) -> dict[str, Any]:
        """The cleaned fields present in the body (absent optional fields are left out)."""
        data = parse_json_object(request)
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise ApiError(400, "parameter_unknown", f"Received unknown parameter: {unknown[0]}.", param=unknown[0])
        cleaned = {}
        for name, field in self.fields.items():
            if name not in data:
                if field.required:
                    raise ApiError(400, "parameter_missing", f"Missing required param: {name}.", param=name)
                continue
            cleaned[name] = field.clean(name, data[name])
        return cleaned


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(request: HttpRequest) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``."""
    body = request.body  # size already bounded by ``route``
    if not body.strip():
        return {}
    content_type = request.content_type or ""
    if content_type and content_type not in ("application/json", "text/plain"):
        raise ApiError(415, "unsupported_media_type", "Send the body as application/json.")
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ApiError(400, "invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return data


# --- the decorator -------------------------------------------------------------------


def route(*methods: Any, atomic: bool = True) -> Callable:
    """Wrap a ``/v1`` view: method check, body bound, authentication by secret key or
    OAuth bearer token (sets ``request.merchant``; ``merchants.credentials``), the
    merchant's rate limit (``api.ratelimit``), ``Idempotency-Key`` on POST, and errors in
    the common format (a service's domain error mapped by ``api.errors``).

    With ``atomic`` (the default) a POST runs in one transaction with its idempotency
    record: either both commit or neither. A view that must commit before calling out
    (confirm calls a rail between two transactions) passes ``atomic=False`` and owns its
    transactions; its answer is then stored after it returns.

    Each method is a string or an ``api.operations.Operation`` declaring what it accepts
    and answers; the wrapper keeps them as ``operations`` for ``api.openapi``.
    """
    operations = tuple(_operation(method) for method in methods)
    allowed = {operation.method for operation in operations}

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            writing = False  # a non-GET view has started: its commit may have happened
            try:
                if request.method not in allowed:
                    raise ApiError(405, "method_not_allowed", f"{request.method} is not allowed here.", allow=allowed)
                if api_version.requested(request.headers) is None:
                    raise unknown_version()
                _bound_body(request)
                request.merchant = credential_authenticate(authorization=request.headers.get("Authorization", ""))
                ratelimit.rate_limit_charge(merchant_id=request.merchant.id)
                _refuse_unstorable(request, kwargs)
                writing = request.method not in ("GET", "HEAD")
                if request.method == "POST" and "Idempotency-Key" in request.headers:
                    return _idempotent(request, view, atomic, args, kwargs)
                if atomic and request.method != "GET":
                    with transaction.atomic():
                        return view(request, *args, **kwargs)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return exc.response()
            except DomainError as exc:
                return ApiError.of(exc).response()
            except TooManyFieldsSent:
                # Django refuses to parse more than DATA_UPLOAD_MAX_NUMBER_FIELDS query
                # parameters the first time anything reads request.GET.
                return too_many_parameters().response()
            except Exception as exc:  # noqa: BLE001 - one error format for every 5xx
                if connection_lost(exc, closed=False) and writing and "Idempotency-Key" not in request.headers:
                    # The link died while a write ran: its transaction rolled back, unless it
                    # died inside the COMMIT after the server had committed. Nobody can say
                    # which, so no "retry shortly" that could make a second refund: the
                    # client reads the object (or retries with an Idempotency-Key, which
                    # replays the first answer if there was one).
                    logger.error(
                        "api write's outcome unknown: the database connection was lost",
                        extra={"path": request.path, "method": request.method, "error": error_chain(exc, 500)},
                    )
                    return error_response(
                        500,
                        "outcome_unknown",
                        "The database connection was lost while this request ran; it may or may not have taken"
                        " effect. Read the object before trying again, or send requests with an Idempotency-Key.",
                        type=API,
                    )
                if connection_lost(exc, closed=False):
                    # The database is away (refused, restarting, the link cut) before anything
                    # was written, or a read, or a write under an Idempotency-Key (its replay
                    # is safe): a 503 the client retries, as for a rail that is down.
                    logger.warning(
                        "api request refused: the database is unavailable",
                        extra={"path": request.path, "method": request.method, "error": error_chain(exc, 500)},
                    )
                    return ApiError(
                        503,
                        "database_unavailable",
                        "The service is briefly unavailable; retry shortly.",
                        type=API,
                        retry_after=DATABASE_RETRY_AFTER_SECONDS,
                    ).response()
                logger.error(
                    "api request failed",
                    extra={"path": request.path, "method": request.method, "error": error_chain(exc, 1000)},
                )
                return error_response(500, "internal_error", "An internal error occurred.", type=API)

        wrapper.operations = operations
        return wrapper

    return decorate


def _operation(method: Any) -> Any:
    """A bare method string as an undeclared ``Operation`` (imported here: it imports us)."""
    from api.operations import Operation

    return Operation(method) if isinstance(method, str) else method


def _refuse_unstorable(request: HttpRequest, kwargs: dict) -> None:
    """No view sees a path id or a query value the database could not even compare: such
    an id names no object, such a filter is refused (and neither is a 500)."""
    if not storable(list(kwargs.values())):
        raise ApiError(404, "resource_missing", "No such object.", param="id")
    for name, values in request.GET.lists():
        if not storable(name) or not storable(values):
            raise ApiError(400, "parameter_invalid", f"Query parameters {_UNSTORABLE}", param=None)


def _bound_body(request: HttpRequest) -> None:
    limit = settings.VPAY_API_MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH") or "0"
    too_big = ApiError(413, "body_too_large", f"The request body is larger than {limit} bytes.")
    try:
        if int(declared) > limit:
            raise too_big
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number.") from None
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_big from None
    if len(body) > limit:
        raise too_big


class _ConcurrentKey(Exception):
    """Another request under the same key committed first: roll ours back."""


def _idempotent(request: HttpRequest, view: Callable, atomic: bool, args: tuple, kwargs: dict) -> HttpResponse:
    key = request.headers["Idempotency-Key"]
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise ApiError(
            400, "idempotency_key_invalid", f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters."
        )
    merchant_id = request.merchant.id
    hashed = idempotency.request_hash(request.method, request.path, request.body)
    try:
        stored = idempotency.lookup(merchant_id, key)
    except idempotency.AnswerUnreadable:
        # Never run the request again: its first run may have moved money.
        raise ApiError(
            409, "idempotency_answer_unreadable", "This key's stored answer can no longer be read.", type=IDEMPOTENCY
        ) from None
    if stored is not None:
        return _replay(stored, hashed)
    try:
        if atomic:
            with transaction.atomic():
                response = view(request, *args, **kwargs)
                if 200 <= response.status_code < 300 and not idempotency.store(
                    merchant_id, key, hashed, response.status_code, response.content
                ):
                    raise _ConcurrentKey
            return response
        response = view(request, *args, **kwargs)
        if 200 <= response.status_code < 300:
            idempotency.store(merchant_id, key, hashed, response.status_code, response.content)
        return response
    except _ConcurrentKey:
        stored = idempotency.lookup(merchant_id, key)
        if stored is None:  # it expired in between: vanishingly rare, and safe to ask again
            raise ApiError(
                409, "idempotency_conflict", "A concurrent request used this key; retry.", type=IDEMPOTENCY
            ) from None
        return _replay(stored, hashed)


def _replay(stored: idempotency.Stored, hashed: str) -> HttpResponse:
    if stored.request_hash != hashed:
        raise ApiError(
            409,
            "idempotency_key_in_use",
            "This Idempotency-Key was used with a different request in the last 24 hours.",
            type=IDEMPOTENCY,
        )
    response = HttpResponse(stored.body, status=stored.status_code, content_type="application/json")
    response["Idempotent-Replayed"] = "true"
    return response


@csrf_exempt  # else CSRF's HTML 403 answers a POST to a path that does not exist
def unknown_route(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any ``/v1`` path no view matched, whatever the method: a 404 in the common format."""
    return error_response(404, "route_missing", f"Unrecognized request URL ({request.method}: {request.path}).")
