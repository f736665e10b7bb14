"""Webhook signing secrets at rest: sealed with ``vpay.sealing`` (Fernet, ``VPAY_SECRETS_KEY``).

A changed ``SECRET_KEY`` in development (whose sealing key derives from it) makes old dev
secrets unreadable: a failed attempt on delivery, never an unsigned send. Nothing here
logs or formats a secret: errors name the problem, never the value.
"""

from __future__ import annotations

import secrets as _random
import string
import threading

from django.conf import settings

from vpay.sealing import Unreadable, derive_dev_key, open_bytes, parse_keys, reseal_bytes, seal_bytes

__all__ = [
    "SECRET_PREFIX",
    "SecretUnreadable",
    "derive_dev_key",
    "new_secret",
    "open_sealed",
    "open_sealed_cached",
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


class _OpenedSecrets:
    """Decrypted signing secrets by their sealed text, per process (otherwise every attempt
    decrypts the same secret again: a Fernet HMAC check and an AES pass each time). Keyed by the sealed text and the configured
    keys: a rotated secret is a new row with a new sealed text, and a changed key set
    decrypts afresh, so nothing cached outlives what the database and settings say. Bounded;
    never logged (values are secrets)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: dict[tuple[str, tuple[str, ...]], str] = {}

    def open(self, sealed: str) -> str:
        key = (sealed, tuple(settings.VPAY_SECRETS_KEYS))
        with self._lock:
            found = self._opened.get(key)
        if found is not None:
            return found
        opened = open_sealed(sealed)  # SecretUnreadable is not cached: a key fix heals it
        with self._lock:
            if len(self._opened) >= self.LIMIT:
                self._opened.clear()
            self._opened[key] = opened
        return opened

    def __repr__(self) -> str:
        return f"<_OpenedSecrets: {len(self._opened)} cached>"


_OPENED = _OpenedSecrets()


def open_sealed_cached(token: str) -> str:
    """:func:`open_sealed`, remembered per process (see :class:`_OpenedSecrets`)."""
    return _OPENED.open(token)
