"""Authenticating a ``/v1`` request: the ``Authorization`` header to a merchant.

Two credentials are accepted, side by side, both as ``Authorization: Bearer …``:

* a secret key, ``sk_live_…`` / ``sk_test_…`` (``merchants.services``);
* a bearer token an OAuth client obtained from ``POST /v1/oauth/token``,
  ``at_live_…`` / ``at_test_…`` (``merchants.clients``).

The prefix says the credential's mode, and a credential authenticates only in its own
mode: a test key is refused by a live deployment (and a live key by a test one), before
any lookup. Which credential a header carries is a pure decision (:func:`classify`); the
lookups then compare digests, and every expiry is compared with the database clock.

:data:`SCHEMES` lists the schemes once, for whatever describes the API (docs, OpenAPI).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from django.conf import settings

from merchants.models import Merchant
from vpay.errors import AuthenticationFailed
from vpay.pipelined import fetch_prepared
from vpay.rows import columns_of, from_row


class Kind(enum.StrEnum):
    """What a bearer credential is."""

    SECRET_KEY = "secret_key"  # noqa: S105 - sk_live_… / sk_test_…
    ACCESS_TOKEN = "access_token"  # noqa: S105 - at_live_… / at_test_…, from POST /v1/oauth/token


PREFIXES: dict[Kind, dict[bool, str]] = {
    Kind.SECRET_KEY: {True: "sk_live_", False: "sk_test_"},
    Kind.ACCESS_TOKEN: {True: "at_live_", False: "at_test_"},
}


@dataclass(frozen=True)
class Scheme:
    """One way to authenticate, as an API description names it: a bearer credential of
    ``kind`` on every ``/v1`` call, or (``kind`` None) the token endpoint's own client
    authentication, carried in its form body."""

    name: str
    kind: Kind | None
    description: str


SCHEMES = (
    Scheme(
        "secret_key",
        Kind.SECRET_KEY,
        "A merchant's secret key as `Authorization: Bearer sk_live_…` (`sk_test_…` outside live mode).",
    ),
    Scheme(
        "oauth_client",
        Kind.ACCESS_TOKEN,
        "A bearer token (`at_live_…`/`at_test_…`) from `POST /v1/oauth/token` (client_credentials with a "
        "private_key_jwt client assertion, RFC 7523), as `Authorization: Bearer at_…`.",
    ),
    Scheme(
        "client_assertion",
        None,
        "`POST /v1/oauth/token` authenticates an OAuth client by a private_key_jwt client assertion "
        "(RFC 7523 §2.2) in its form body: `client_assertion_type=urn:ietf:params:oauth:client-assertion-type:"
        "jwt-bearer` and `client_assertion`, a JWT signed with the client's registered key whose `iss` = `sub` = "
        "the client id, `aud` the token URL, `exp` at most 5 minutes ahead and `jti` never used before.",
    ),
)

REFUSAL_CODES = ("api_key_missing", "api_key_invalid", "access_token_invalid", "livemode_mismatch")
"""Every ``code`` of an :class:`AuthenticationFailed` raised here."""


def prefix(kind: Kind, *, live_mode: bool) -> str:
    """The prefix a new credential of ``kind`` gets in this mode."""
    return PREFIXES[kind][live_mode]


def digest(secret: str) -> str:
    """What is stored of a key or token: 256 random bits make a fast digest as good as a
    slow password hash here, at no cost per request."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _refusal(code: str, message: str) -> AuthenticationFailed:
    return AuthenticationFailed(code, message)  # a fresh one each time: an exception keeps its traceback


def _missing() -> AuthenticationFailed:
    return _refusal("api_key_missing", "Provide your API key as 'Authorization: Bearer sk_…'.")


def _malformed() -> AuthenticationFailed:
    return _refusal("api_key_invalid", "The Authorization header is not 'Bearer sk_…' or 'Bearer at_…'.")


def _wrong_mode(kind: Kind, *, live_mode: bool) -> AuthenticationFailed:
    what = "key" if kind is Kind.SECRET_KEY else "access token"
    if live_mode:
        return _refusal("livemode_mismatch", f"A test {what} cannot be used in live mode.")
    return _refusal("livemode_mismatch", f"A live {what} cannot be used outside live mode.")


def classify(authorization: str, *, live_mode: bool) -> tuple[Kind, str]:
    """The credential in an ``Authorization`` header and its kind, or the refusal.

    Pure: the decision table of ``tests/test_credentials.py``. Never echoes the header.
    """
    if not authorization:
        raise _missing()
    scheme, _, credential = authorization.partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        raise _malformed()
    for kind, by_mode in PREFIXES.items():
        if credential.startswith(by_mode[live_mode]):
            return kind, credential
        if credential.startswith(by_mode[not live_mode]):
            raise _wrong_mode(kind, live_mode=live_mode)
    raise _malformed()


# The merchant of a secret key that is not revoked and not past the overlap of a roll
# (database clock: the statement's instant, as Django's Now() reads it). Plain SQL, not the
# ORM's: it runs on every /v1 request, and compiling the queryset was a quarter of the web
# process's CPU on the payments path (bench/CHARGES.md, "The web process's confirm");
# prepared (vpay.pipelined), as planning the join cost the server three times its run.
# merchant_api_keys' unique index on digest, then merchants_pkey.
_BY_SECRET_KEY = f"""
SELECT {columns_of(Merchant, "m")}
  FROM merchant_api_keys k JOIN merchants m ON m.id = k.merchant_id
 WHERE k.digest = %(digest)s AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > statement_timestamp())
"""

# The merchant of an access token not expired whose client is not revoked.
# oauth_access_tokens' unique index on digest, then oauth_clients_pkey and merchants_pkey.
_BY_ACCESS_TOKEN = f"""
SELECT {columns_of(Merchant, "m")}
  FROM oauth_access_tokens t
  JOIN oauth_clients c ON c.id = t.client_id
  JOIN merchants m ON m.id = c.merchant_id
 WHERE t.digest = %(digest)s AND t.expires_at > statement_timestamp() AND c.revoked_at IS NULL
"""


def credential_authenticate(*, authorization: str) -> Merchant:
    """The merchant an ``Authorization`` header authenticates, or :class:`AuthenticationFailed`.

    One indexed read either way (the unique digest): a key that is not revoked and not past
    the overlap of a roll, or a token not expired whose client is not revoked.
    """
    kind, credential = classify(authorization, live_mode=settings.LIVE_MODE)
    by_key = kind is Kind.SECRET_KEY
    rows = fetch_prepared(_BY_SECRET_KEY if by_key else _BY_ACCESS_TOKEN, {"digest": digest(credential)})
    if not rows:
        if by_key:
            raise _refusal("api_key_invalid", "Invalid API key.")
        raise _refusal("access_token_invalid", "Invalid or expired access token.")
    return from_row(Merchant, rows[0])
