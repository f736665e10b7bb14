"""OAuth clients: registration, revocation, and the client-credentials grant with a
``private_key_jwt`` client assertion (RFC 7523 §2.2, RFC 7521 §4.2).

A client proves itself with a JWT it signs with its private key; vpay holds only the
public key. The JWS is verified by PyJWT (never by hand), with an algorithm the client's
key type allows: RSA keys RS256/PS256, EC P-256 keys ES256, Ed25519 keys EdDSA.
``none`` and every HMAC algorithm are refused before any key is touched (an HMAC "signed"
with a public key is the classic algorithm-confusion forgery).

The assertion's times are judged against the database clock (:func:`assertion_time_refusal`,
a pure table); its ``jti`` is stored until it expires, so a replay is refused, and the hourly
sweep deletes expired ones (``merchants.sweeps``). The bearer token granted is random, stored
by digest, and expires on the database clock.
"""

from __future__ import annotations

import logging
import math
import numbers
from datetime import timedelta

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from api.ratelimit import rate_limit_key
from api.storable import storable
from merchants import credentials
from merchants.credentials import Kind
from merchants.models import AccessToken, Merchant, OAuthClient
from merchants.services import clean_reason
from vpay.admin_log import log_change
from vpay.errors import GrantRefused, InvalidInput, InvalidState, NotFound, RateLimited
from vpay.tokens import new_token

logger = logging.getLogger(__name__)

GRANT_TYPE = "client_credentials"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
MAX_ASSERTION_LIFETIME = 300  # exp at most 5 minutes ahead (RFC 7523 leaves it to us)
CLOCK_LEEWAY = 30  # seconds of skew forgiven between the client's clock and ours
JTI_MAX = 255
ASSERTION_MAX = 8192
MIN_RSA_BITS = 2048


def _algorithms_for(key) -> tuple[str, ...]:
    """The JWS algorithms a public key may sign with; empty for a key type we refuse."""
    if isinstance(key, rsa.RSAPublicKey):
        return ("RS256", "PS256") if key.key_size >= MIN_RSA_BITS else ()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return ("ES256",) if isinstance(key.curve, ec.SECP256R1) else ()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return ("EdDSA",)
    return ()


ACCEPTED_ALGORITHMS = frozenset({"RS256", "PS256", "ES256", "EdDSA"})


def public_key_load(pem: str):
    """The public key in ``pem`` if vpay accepts it, else :class:`InvalidInput`.

    A private key is refused without being kept or echoed: an operator who pasted one by
    mistake must generate a new pair, since the private half has left its owner.
    """
    text = (pem or "").strip()
    if "PRIVATE KEY" in text:
        raise InvalidInput(
            "private_key_given",
            "That is a private key: register the public key only, and replace this key pair (its private half is exposed).",
            param="public_key",
        )
    try:
        key = serialization.load_pem_public_key(text.encode())
    except (ValueError, TypeError, UnicodeError):
        raise InvalidInput(
            "public_key_invalid", "Not a PEM public key (-----BEGIN PUBLIC KEY-----).", param="public_key"
        ) from None
    if not _algorithms_for(key):
        raise InvalidInput(
            "public_key_unsupported",
            f"Accepted keys: RSA of {MIN_RSA_BITS} bits or more, EC P-256, Ed25519.",
            param="public_key",
        )
    return key


@transaction.atomic
def oauth_client_register(*, merchant_id: str, name: str, public_key: str, actor=None) -> OAuthClient:
    """A new client of the merchant, identified by the returned ``cli_…`` id."""
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise InvalidInput("name_invalid", "A client name is 1 to 200 characters.", param="name")
    key = public_key_load(public_key)
    merchant = Merchant.objects.filter(id=merchant_id).first()
    if merchant is None:
        raise NotFound("merchant_missing", f"No such merchant: {merchant_id!r}.", param="merchant")
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    client = OAuthClient.objects.create(merchant=merchant, name=name, public_key=pem)
    log_change(actor, Merchant, merchant.id, str(merchant), f"Registered OAuth client {client.id} ({name}).")
    logger.info("oauth client registered", extra={"merchant": merchant.id, "client": client.id})
    return client


@transaction.atomic
def oauth_client_revoke(*, client_id: str, reason: str, actor=None) -> OAuthClient:
    """Stop a client now: no new tokens, and the tokens it holds stop authenticating."""
    reason = clean_reason(reason)
    client = OAuthClient.objects.select_for_update().filter(id=client_id).first()
    if client is None:
        raise NotFound("client_missing", f"No such client: {client_id!r}.", param="client")
    if client.revoked_at is not None:
        raise InvalidState("client_revoked", f"{client.id} is already revoked.", param="client")
    OAuthClient.objects.filter(pk=client.pk).update(revoked_at=Now(), revoked_reason=reason)
    client.refresh_from_db()
    log_change(actor, Merchant, client.merchant_id, client.merchant_id, f"Revoked OAuth client {client.id}: {reason}")
    logger.info("oauth client revoked", extra={"merchant": client.merchant_id, "client": client.id})
    return client


def _numeric(value) -> bool:
    # Finite too: JSON as Python reads it has NaN and Infinity, and NaN compares false with
    # every bound (it would pass them all). An int is finite however long (and too long
    # for math.isfinite, which converts it to a float).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or math.isfinite(value)


def assertion_time_refusal(
    *, now: float, exp, nbf=None, iat=None, max_lifetime: int = MAX_ASSERTION_LIFETIME, leeway: int = CLOCK_LEEWAY
) -> str | None:
    """Why an assertion's times are refused at ``now`` (the database clock, epoch seconds),
    or ``None``. Pure: ``tests/test_oauth_clients.py`` runs it as a table."""
    if not _numeric(exp):
        return "exp must be a NumericDate."
    if exp <= now - leeway:
        return "The assertion has expired."
    if exp > now + max_lifetime + leeway:
        return f"exp is more than {max_lifetime} seconds ahead."
    for claim, value in (("nbf", nbf), ("iat", iat)):
        if value is None:
            continue
        if not _numeric(value):
            return f"{claim} must be a NumericDate."
        if value > now + leeway:
            return f"{claim} is in the future."
    return None


def _invalid_client(description: str) -> GrantRefused:
    return GrantRefused("invalid_client", description)


def _verified_claims(assertion: str, audience: str) -> tuple[OAuthClient, dict]:
    """The client and the claims of a signature-checked assertion, or ``invalid_client``."""
    try:
        header = jwt.get_unverified_header(assertion)
        unverified = jwt.decode(assertion, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        raise _invalid_client("client_assertion is not a JWT.") from None
    alg = header.get("alg")
    if alg not in ACCEPTED_ALGORITHMS:
        raise _invalid_client(f"alg {str(alg)[:20]!r} is not accepted: sign with RS256, PS256, ES256 or EdDSA.")
    issuer = unverified.get("iss")
    # Text the database cannot hold (a NUL, a lone surrogate: JSON escapes carry both) names
    # no client; asked about, it would be a database error, before any signature is checked.
    known = isinstance(issuer, str) and storable(issuer)
    client = OAuthClient.objects.select_related("merchant").filter(id=issuer).first() if known else None
    if client is None:
        raise _invalid_client("Unknown client: iss must be your client id (cli_…).")
    if client.revoked_at is not None:
        raise _invalid_client(f"Client {client.id} is revoked.")
    key = serialization.load_pem_public_key(client.public_key.encode())
    if alg not in _algorithms_for(key):
        raise _invalid_client(f"alg {alg} does not match the client's key; use {' or '.join(_algorithms_for(key))}.")
    try:
        claims = jwt.decode(
            assertion,
            key,
            algorithms=[alg],
            audience=audience,
            issuer=client.id,
            # Times are checked against the database clock (assertion_time_refusal).
            options={
                "require": ["iss", "sub", "aud", "exp", "jti"],
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
            },
        )
    except jwt.InvalidSignatureError:
        raise _invalid_client("The signature does not verify with the client's registered key.") from None
    except jwt.InvalidAudienceError:
        raise _invalid_client(f"aud must be the token endpoint, {audience}.") from None
    except jwt.MissingRequiredClaimError as exc:
        raise _invalid_client(f"The assertion lacks the {exc.claim} claim.") from None
    except jwt.InvalidTokenError as exc:
        raise _invalid_client(f"The assertion is not valid ({type(exc).__name__}).") from None
    if claims.get("sub") != client.id:
        raise _invalid_client("sub must equal iss, the client id.")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti or len(jti) > JTI_MAX or not storable(jti):
        raise _invalid_client(
            f"jti must be a string of 1 to {JTI_MAX} characters, none of them NUL or a lone surrogate."
        )
    return client, claims


def _db_now() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now())")  # the database clock; no table
        return float(cursor.fetchone()[0])


def _record_jti(client_id: str, jti: str, exp: float) -> bool:
    """Store the jti until the assertion could no longer be accepted; ``False`` on a replay.

    A row left by an expired assertion the sweep has not deleted yet is reused in place.
    """
    with connection.cursor() as cursor:
        # The unique (client_id, jti) index decides the race between two presentations of
        # one assertion: the second waits for the first's commit and finds its live row.
        cursor.execute(
            "INSERT INTO oauth_assertion_jtis (client_id, jti, expires_at)"
            " VALUES (%s, %s, to_timestamp(%s) + make_interval(secs => %s))"
            " ON CONFLICT (client_id, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at"
            " WHERE oauth_assertion_jtis.expires_at <= now()"
            " RETURNING 1",
            [client_id, jti, exp, CLOCK_LEEWAY],
        )
        return cursor.fetchone() is not None


def _refuse_past_the_cap(client_id: str) -> None:
    """:class:`RateLimited` when the client already holds ``VPAY_OAUTH_MAX_LIVE_TOKENS``
    unexpired tokens, with Retry-After the seconds until the first of them expires."""
    cap = settings.VPAY_OAUTH_MAX_LIVE_TOKENS
    with connection.cursor() as cursor:
        # The client's unexpired tokens (oauth_access_tokens' client_id foreign-key index);
        # expired ones are not counted, whether the hourly sweep has deleted them yet or not.
        cursor.execute(
            "SELECT count(*), extract(epoch FROM min(expires_at) - now()) FROM oauth_access_tokens"
            " WHERE client_id = %s AND expires_at > now()",
            [client_id],
        )
        live, first_expiry = cursor.fetchone()
    if live >= cap:
        raise RateLimited(
            "too_many_tokens",
            f"This client holds {cap} unexpired tokens, the most it may: reuse one until it expires.",
            retry_after=max(1, math.ceil(float(first_expiry))),
        )


def access_token_issue(
    *, grant_type: str, client_assertion_type: str, client_assertion: str, audience: str, client_id: str = ""
) -> tuple[str, int, OAuthClient]:
    """The client-credentials grant: a new bearer token, its lifetime in seconds and the
    client, or :class:`GrantRefused` in RFC 6749 §5.2's vocabulary. ``audience`` is this
    token endpoint's URL, the only ``aud`` accepted."""
    if not grant_type:
        raise GrantRefused("invalid_request", "grant_type is required.")
    if grant_type != GRANT_TYPE:
        raise GrantRefused("unsupported_grant_type", f"Only grant_type={GRANT_TYPE} is supported.")
    if client_assertion_type != ASSERTION_TYPE:
        raise GrantRefused("invalid_request", f"client_assertion_type must be {ASSERTION_TYPE}.")
    if not client_assertion or len(client_assertion) > ASSERTION_MAX:
        raise GrantRefused("invalid_request", f"client_assertion is required (at most {ASSERTION_MAX} characters).")
    client, claims = _verified_claims(client_assertion, audience)
    if client_id and client_id != client.id:
        raise _invalid_client("client_id does not match the assertion's iss.")
    # Counted once the signature verified: only the key's holder spends the client's window.
    rate_limit_key(
        key=f"oauth_token_client:{client.id}",
        limit=settings.VPAY_OAUTH_TOKEN_RATE_LIMIT,
        window=settings.VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS,
        what="for a client",
    )
    refusal = assertion_time_refusal(now=_db_now(), exp=claims["exp"], nbf=claims.get("nbf"), iat=claims.get("iat"))
    if refusal:
        raise _invalid_client(refusal)
    ttl = settings.VPAY_OAUTH_TOKEN_TTL_SECONDS
    token = new_token(credentials.prefix(Kind.ACCESS_TOKEN, live_mode=settings.LIVE_MODE), bits=256)
    with transaction.atomic():
        if not _record_jti(client.id, claims["jti"], float(claims["exp"])):
            raise _invalid_client("This assertion's jti was already used: sign a new assertion with a fresh jti.")
        client_row = OAuthClient.objects.select_for_update().filter(pk=client.pk, revoked_at__isnull=True).first()
        if client_row is None:  # revoked while we verified
            raise _invalid_client(f"Client {client.id} is revoked.")
        _refuse_past_the_cap(client.id)  # under the client's lock: two requests cannot both pass
        AccessToken.objects.create(
            digest=credentials.digest(token), client=client_row, expires_at=Now() + timedelta(seconds=ttl)
        )
    logger.info("oauth token issued", extra={"merchant": client.merchant_id, "client": client.id, "expires_in": ttl})
    return token, ttl, client
