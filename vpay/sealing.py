"""Sealing values at rest: Fernet (``cryptography``) keyed by ``VPAY_SECRETS_KEY``.

``VPAY_SECRETS_KEY`` is one or more comma-separated Fernet keys (urlsafe base64 of 32
bytes). The first seals; every one opens, so the key itself can be rotated: put the new
key first, re-seal, then drop the old key. Live mode requires the setting; in development
a key is derived from ``SECRET_KEY`` so a fresh checkout works without configuration.

Used for webhook signing secrets (``webhooks.sealing``); ``api.idempotency`` seals stored
answers with the same keys. Errors name the problem, never the value.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class Unreadable(Exception):
    """A sealed value could not be opened with any configured key (the message carries no value)."""


def derive_dev_key(secret_key: str) -> str:
    """A Fernet key derived from Django's ``SECRET_KEY`` (development only)."""
    digest = hashlib.sha256(b"vpay webhook secrets v1\x00" + secret_key.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii")


def parse_keys(text: str) -> list[str]:
    """The configured keys, first (sealing) key first; ValueError names the bad position only."""
    keys = [part.strip() for part in text.split(",") if part.strip()]
    for index, key in enumerate(keys):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ValueError(
                f"VPAY_SECRETS_KEY: key #{index + 1} is not a Fernet key (urlsafe base64 of 32 bytes)"
            ) from None
    return keys


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(k) for k in keys])


def _current() -> MultiFernet:
    return _fernet(tuple(settings.VPAY_SECRETS_KEYS))


def seal_bytes(data: bytes) -> bytes:
    """``data`` encrypted and authenticated with the first configured key."""
    return _current().encrypt(data)


def open_bytes(token: bytes) -> bytes:
    """The bytes inside ``token``, or :class:`Unreadable`."""
    try:
        return _current().decrypt(token)
    except (InvalidToken, TypeError, ValueError):
        raise Unreadable("a sealed value could not be decrypted with any configured VPAY_SECRETS_KEY") from None


def reseal_bytes(token: bytes) -> bytes:
    """``token`` re-encrypted under the first (current) key, for key rotation."""
    try:
        return _current().rotate(token)
    except (InvalidToken, TypeError, ValueError):
        raise Unreadable("a sealed value could not be decrypted with any configured VPAY_SECRETS_KEY") from None


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` looks like a Fernet token (version byte 0x80, base64 ``gAAAAA``)."""
    return data.startswith(b"gAAAAA")
