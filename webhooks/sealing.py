"""Webhook signing secrets at rest: sealed with ``vpay.sealing`` (Fernet, ``VPAY_SECRETS_KEY``).

A changed ``SECRET_KEY`` in development (whose sealing key derives from it) makes old dev
secrets unreadable: a failed attempt on delivery, never an unsigned send. Nothing here
logs or formats a secret: errors name the problem, never the value.
"""

from __future__ import annotations

import secrets as _random
import string

from vpay.sealing import Unreadable, derive_dev_key, open_bytes, parse_keys, reseal_bytes, seal_bytes

__all__ = [
    "SECRET_PREFIX",
    "SecretUnreadable",
    "derive_dev_key",
    "new_secret",
    "open_sealed",
    "parse_keys",
    "reseal",
    "seal",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SecretUnreadable = Unreadable

_ALPHABET = string.ascii_letters + string.digits


def new_secret() -> str:
    """A fresh endpoint signing secret: ``whsec_`` + 43 random base62 characters (256 bits).

    Letters and digits only, so the log redaction pattern (``whsec_[A-Za-z0-9_]+``) scrubs
    the whole secret, never a prefix of it.
    """
    return SECRET_PREFIX + "".join(_random.choice(_ALPHABET) for _ in range(43))


def seal(secret: str) -> str:
    """The secret encrypted and authenticated with the first configured key (text, for a column)."""
    return seal_bytes(secret.encode("utf-8")).decode("ascii")


def open_sealed(token: str) -> str:
    """The secret inside ``token``, or :class:`SecretUnreadable`."""
    try:
        return open_bytes(token.encode("ascii")).decode("utf-8")
    except (UnicodeError, ValueError):
        raise SecretUnreadable("a webhook secret could not be decrypted with any configured VPAY_SECRETS_KEY") from None


def reseal(token: str) -> str:
    """``token`` re-encrypted under the first (current) key, for key rotation."""
    try:
        return reseal_bytes(token.encode("ascii")).decode("ascii")
    except (UnicodeError, ValueError):
        raise SecretUnreadable("a webhook secret could not be decrypted with any configured VPAY_SECRETS_KEY") from None
