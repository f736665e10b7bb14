"""The webhook signature: the sending half (``signature_header``) and the receiver's ``verify``.

The scheme is byte-for-byte Stripe's, so a Stripe-style verifier accepts vpay's header
given the endpoint secret::

    Vpay-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]
    v1 = hex(HMAC-SHA256(key=secret.encode("utf-8"), msg=t_text + "." + body))

``t_text`` is the literal text written into the header, never a number re-rendered on
either side; ``body`` is the exact bytes on the wire. One ``v1`` per active secret, in
configuration order: during a rotation a receiver holding either secret verifies.

This module is pure (no Django, no settings): the sandbox receiver and merchants' own
code import :func:`verify` as it is.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections.abc import Sequence

HEADER = "Vpay-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE = 300
# Bounds a receiver applies before doing any work for a header: a hostile sender must not
# make verify() hash a megabyte of v1 values.
MAX_HEADER_LENGTH = 8192
MAX_SIGNATURES = 32

_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII digits only; str.isdigit() accepts "²" and "٣"
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class SignatureVerificationError(ValueError):
    """The payload is not authenticated by the header. The only exception :func:`verify` raises.

    The message says why (malformed header, no matching signature, timestamp outside the
    tolerance) and never contains a secret or a computed signature.
    """


def compute_signature(t_text: str, body: bytes, secret: str) -> str:
    """Hex HMAC-SHA256 of ``t_text + "." + body`` keyed with the secret's UTF-8 bytes."""
    message = t_text.encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(body: bytes, secrets: Sequence[str], timestamp: int) -> str:
    """The ``Vpay-Signature`` value for ``body`` signed at ``timestamp`` with every secret, in order.

    ``t`` is rendered once and that same text is signed. With no secrets the header is
    ``t=…`` alone, which every verifier refuses as malformed; callers never send that
    (an endpoint without a usable secret is a failed attempt, never an unsigned send).
    """
    if not isinstance(body, bytes | bytearray):
        raise TypeError("body must be the bytes sent on the wire")
    t_text = str(int(timestamp))
    parts = [f"t={t_text}"]
    parts.extend(f"{SCHEME}={compute_signature(t_text, bytes(body), secret)}" for secret in secrets)
    return ",".join(parts)


def parse_header(header: str) -> tuple[str, list[str]]:
    """``(t_text, [v1 values])`` of a header, or :class:`SignatureVerificationError`.

    Items are ``key=value`` separated by commas; unknown keys (another scheme such as
    ``v0``) are ignored, as Stripe's verifiers do. Exactly one ``t``, all ASCII digits.
    """
    if not isinstance(header, str):
        raise SignatureVerificationError("signature header must be a string")
    if len(header) > MAX_HEADER_LENGTH:
        raise SignatureVerificationError("signature header is too long")
    t_values: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise SignatureVerificationError("malformed signature header: an item is not key=value")
        if key == "t":
            t_values.append(value)
        elif key == SCHEME:
            signatures.append(value)
    if len(t_values) != 1 or not _DIGITS.fullmatch(t_values[0]):
        raise SignatureVerificationError("malformed signature header: need exactly one t=<unix seconds>")
    if not signatures:
        raise SignatureVerificationError(f"malformed signature header: no {SCHEME} signature")
    if len(signatures) > MAX_SIGNATURES:
        raise SignatureVerificationError("malformed signature header: too many signatures")
    return t_values[0], signatures


def verify(
    payload: bytes | str,
    header: str,
    secrets: str | Sequence[str],
    tolerance: int = DEFAULT_TOLERANCE,
    *,
    now: float | None = None,
) -> int:
    """Check that ``header`` signs ``payload`` with one of ``secrets``; return the timestamp.

    ``payload`` is the raw request body exactly as received (bytes; a str is encoded as
    UTF-8). Any one matching ``v1`` accepts. The timestamp must be within ``tolerance``
    seconds of ``now`` (default: this host's clock) in either direction. Comparisons are
    constant-time.

    ``tolerance`` must be a positive, finite number of seconds: the age check is the
    replay protection, and there is no way to switch it off. Anything else (0, a negative,
    NaN, infinity, a non-number) is the caller's mistake, refused with a plain
    ``ValueError`` before the request is looked at, so it cannot pass unnoticed as one
    more bad request.

    Otherwise raises :class:`SignatureVerificationError` and nothing else, whatever the
    payload, header and secrets.
    """
    _check_tolerance(tolerance)
    try:
        body = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        keys = [secrets] if isinstance(secrets, str) else list(secrets)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise SignatureVerificationError("no secret to verify with")
        t_text, signatures = parse_header(header)
        matched = False
        for key in keys:
            expected = compute_signature(t_text, body, key).encode("ascii")
            for candidate in signatures:
                # Compare every candidate (no early exit) so timing says nothing about which matched.
                if _HEX_SIGNATURE.fullmatch(candidate) and hmac.compare_digest(expected, candidate.encode("ascii")):
                    matched = True
        if not matched:
            raise SignatureVerificationError("no signature matches the payload with the given secret(s)")
        timestamp = int(t_text)
        current = time.time() if now is None else now
        if abs(current - timestamp) > tolerance:
            raise SignatureVerificationError("timestamp outside the tolerance window")
        return timestamp
    except SignatureVerificationError:
        raise
    except Exception as exc:  # noqa: BLE001 - the documented contract: one exception type, always
        raise SignatureVerificationError(f"could not verify: {type(exc).__name__}") from None


def _check_tolerance(tolerance: object) -> None:
    valid = (
        isinstance(tolerance, int | float)
        and not isinstance(tolerance, bool)
        and math.isfinite(tolerance)
        and tolerance > 0
    )
    if not valid:
        raise ValueError(f"tolerance must be a positive, finite number of seconds (got {tolerance!r})")
