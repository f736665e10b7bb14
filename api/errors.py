"""Domain errors to HTTP: the one place a service's refusal (``vpay.errors``) gets a status
code and an error ``type``. Services raise; ``api.framework.route`` answers."""

from __future__ import annotations

from vpay.errors import (
    AuthenticationFailed,
    DomainError,
    InvalidInput,
    InvalidState,
    NotFound,
    RateLimited,
    Unavailable,
)

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
IDEMPOTENCY = "idempotency_error"
RATE_LIMIT = "rate_limit_error"
API = "api_error"

# Most specific first: the first class the error is an instance of decides.
_HTTP: tuple[tuple[type[DomainError], int, str], ...] = (
    (AuthenticationFailed, 401, AUTHENTICATION),
    (RateLimited, 429, RATE_LIMIT),
    (Unavailable, 503, API),
    (NotFound, 404, INVALID_REQUEST),
    (InvalidState, 409, INVALID_REQUEST),
    (InvalidInput, 400, INVALID_REQUEST),
)


def http_of(exc: DomainError) -> tuple[int, str]:
    """The status and error type a domain error answers with (400 for one not listed)."""
    for cls, status, error_type in _HTTP:
        if isinstance(exc, cls):
            return status, error_type
    return 400, INVALID_REQUEST
