"""Sealing values at rest: Fernet (``cryptography``) keyed by ``VPAY_SECRETS_KEY``.

``VPAY_SECRETS_KEY`` is one or more comma-separated Fernet keys (urlsafe base64 of 32
bytes). The first seals; every one opens, so the key itself can be rotated: put the new
key first, re-seal, then drop the old key. Live mode requires the setting; in development
a key is derived from ``SECRET_KEY`` so a fresh checkout works without configuration.

Used for webhook signing secrets (``webhooks.sealing``); ``api.idempotency`` seals stored
answers with the same keys, and :class:`SealedTextField` seals the payer's credentials
(a checkout session's client secret, a charge's ``pay_token`` and redirect URL). Errors
name the problem, never the value.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models


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


def seal_text(value: str | None) -> str | None:
    """``value`` sealed, as text for a column (None stays None)."""
    return None if value is None else seal_bytes(value.encode("utf-8")).decode("ascii")


def open_text(token: str | None) -> str | None:
    """The text inside a :func:`seal_text` token (None stays None), or :class:`Unreadable`."""
    if token is None:
        return None
    try:
        return open_bytes(token.encode("ascii")).decode("utf-8")
    except (UnicodeError, ValueError):
        raise Unreadable("a sealed value could not be decrypted with any configured VPAY_SECRETS_KEY") from None


class SealedTextField(models.TextField):
    """A text column holding a Fernet token: sealed on the way in, opened on the way out.

    Sealing is randomized, so the column cannot be searched by value: every lookup but
    ``isnull`` is refused (a filter by value would silently match nothing). Raw SQL that
    reads the column gets the token and opens it with :func:`open_text`. A value sealed
    under a key that is no longer configured raises :class:`Unreadable` when read.
    """

    def from_db_value(self, value, expression, connection):
        return open_text(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return seal_text(value) if isinstance(value, str) else value

    def get_lookup(self, lookup_name):
        if lookup_name != "isnull":
            raise TypeError(f"{self.name} is sealed at rest and cannot be searched by value ({lookup_name!r})")
        return super().get_lookup(lookup_name)
