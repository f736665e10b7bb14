"""``POST /v1/oauth/token``: the client-credentials grant with a ``private_key_jwt`` client
assertion (``merchants.clients``). Its answers follow RFC 6749 §5.1/§5.2, not the rest of
``/v1``: ``{"access_token", "token_type", "expires_in"}``, or ``{"error",
"error_description"}`` with 400 (401 for ``invalid_client``), never cached.

Form-encoded, as OAuth requires::

    grant_type=client_credentials
    client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer
    client_assertion=<JWT: iss = sub = the client id, aud = this URL, exp ≤ 5 min, a unique jti>
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import ratelimit, schemas
from api.framework import Body, Field
from api.operations import Answer, Operation, describe
from merchants.clients import ASSERTION_MAX, ASSERTION_TYPE, access_token_issue
from vpay.errors import GrantRefused, RateLimited, error_chain

logger = logging.getLogger(__name__)

TOKEN_PATH = "/v1/oauth/token"  # noqa: S105 - a path, not a secret
FORM = "application/x-www-form-urlencoded"


def token_url() -> str:
    """The token endpoint's own URL, the only ``aud`` accepted (``VPAY_OAUTH_TOKEN_URL``,
    else ``VPAY_PUBLIC_URL`` + the path)."""
    return settings.VPAY_OAUTH_TOKEN_URL or settings.VPAY_PUBLIC_URL.rstrip("/") + TOKEN_PATH


# The form the grant reads, field by field (the view passes exactly these names on).
TOKEN_FORM = Body(
    grant_type=Field(str, required=True, choices=["client_credentials"]),
    client_assertion_type=Field(str, required=True, choices=[ASSERTION_TYPE]),
    client_assertion=Field(
        str, required=True, max_length=ASSERTION_MAX, description="The JWT (client_assertion security scheme)."
    ),
    client_id=Field(str, description="Optional; must equal the assertion's iss."),
)
_NO_STORE = {"Cache-Control": {"type": "string", "const": "no-store"}}


def _answer(body: dict, status: int = 200) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"  # RFC 6749 §5.1: a token must not be cached
    response["Pragma"] = "no-cache"
    return response


def _refusal(error: str, description: str) -> JsonResponse:
    return _answer({"error": error, "error_description": description}, 401 if error == "invalid_client" else 400)


@describe(
    Operation(
        "POST",
        "A bearer token for an OAuth client (client_credentials, private_key_jwt).",
        form=TOKEN_FORM,
        public=True,
        responses={
            200: Answer("The token, never cached.", schemas.OAUTH_TOKEN, headers=_NO_STORE),
            400: Answer("invalid_request or unsupported_grant_type (RFC 6749 §5.2).", schemas.ref("oauth_error")),
            401: Answer("invalid_client: every refusal of the assertion or the client.", schemas.ref("oauth_error")),
            429: Answer(
                "rate_limited (per source address, per client) or too_many_tokens (the client's live tokens);"
                " wait Retry-After seconds.",
                schemas.ref("oauth_error"),
                headers={**_NO_STORE, "Retry-After": {"type": "integer"}},
            ),
            500: Answer("server_error.", schemas.ref("oauth_error")),
        },
    )
)
@csrf_exempt
def token(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        response = _refusal("invalid_request", "Use POST.")
        response.status_code = 405
        response["Allow"] = "POST"
        return response
    try:
        # Every request from the address counts, before anything is parsed or verified.
        ratelimit.rate_limit_key(
            key=f"oauth_token_address:{request.META.get('REMOTE_ADDR', '')}",
            limit=settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT,
            window=settings.VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS,
            what="from an address",
        )
        if request.content_type != FORM:
            return _refusal("invalid_request", f"Send the parameters as {FORM}.")
        if len(request.body) > settings.VPAY_API_MAX_BODY_BYTES:
            raise RequestDataTooBig
        form = request.POST
        for name in form:
            if len(form.getlist(name)) != 1:
                return _refusal("invalid_request", f"{name} may be given once.")
        issued, expires_in, _client = access_token_issue(
            **{name: form.get(name, "") for name in TOKEN_FORM.fields}, audience=token_url()
        )
    except RequestDataTooBig:
        return _refusal("invalid_request", f"The request body is larger than {settings.VPAY_API_MAX_BODY_BYTES} bytes.")
    except TooManyFieldsSent:  # Django parses at most DATA_UPLOAD_MAX_NUMBER_FIELDS
        return _refusal("invalid_request", f"At most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields may be sent.")
    except RateLimited as exc:
        logger.info("oauth token rate limited", extra={"error": exc.code, "description": exc.message})
        response = _answer({"error": exc.code, "error_description": exc.message}, 429)
        response["Retry-After"] = str(exc.retry_after)
        return response
    except GrantRefused as exc:
        logger.info("oauth token refused", extra={"error": exc.code, "description": exc.message})
        return _refusal(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - an OAuth-shaped 500, never a page
        logger.error("oauth token failed", extra={"path": request.path, "error": error_chain(exc, 1000)})
        return _answer({"error": "server_error", "error_description": "An internal error occurred."}, 500)
    return _answer({"access_token": issued, "token_type": "Bearer", "expires_in": expires_in})
