"""Webhook signing secrets at rest: sealed with Fernet (``cryptography``), keyed from settings.

``VPAY_SECRETS_KEY`` is one or more comma-separated Fernet keys (urlsafe base64 of 32
bytes). The first seals; every one opens, so the key itself can be rotated: put the new
key first, re-seal (``manage.py`` shell: :func:`reseal`), then drop the old key. Live mode
requires the setting; in development a key is derived from ``SECRET_KEY`` so a fresh
checkout works without configuration (and a changed ``SECRET_KEY`` makes old dev secrets
unreadable, which is a failed attempt on delivery, never an unsigned send).

Nothing here logs or formats a secret: errors name the problem, never the value.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import secrets as _random
import string

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret


class SecretUnreadable(Exception):
    """A sealed secret could not be opened with any configured key (message carries no secret)."""


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


_ALPHABET = string.ascii_letters + string.digits


def new_secret() -> str:
    """A fresh endpoint signing secret: ``whsec_`` + 43 random base62 characters (256 bits).

    Letters and digits only, so the log redaction pattern (``whsec_[A-Za-z0-9_]+``) scrubs
    the whole secret, never a prefix of it.
    """
    return SECRET_PREFIX + "".join(_random.choice(_ALPHABET) for _ in range(43))


def seal(secret: str) -> str:
    """The secret encrypted and authenticated with the first configured key (text, for a column)."""
    return _current().encrypt(secret.encode("utf-8")).decode("ascii")


def open_sealed(token: str) -> str:
    """The secret inside ``token``, or :class:`SecretUnreadable`."""
    try:
        return _current().decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError, ValueError):
        raise SecretUnreadable("a webhook secret could not be decrypted with any configured VPAY_SECRETS_KEY") from None


def reseal(token: str) -> str:
    """``token`` re-encrypted under the first (current) key, for key rotation."""
    try:
        return _current().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise SecretUnreadable("a webhook secret could not be decrypted with any configured VPAY_SECRETS_KEY") from None
