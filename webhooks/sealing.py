"""Webhook signing secrets at rest: sealed with ``vpay.sealing`` (``VPAY_SECRETS_KEY``).

Each is bound to its endpoint (``webhook_secrets.endpoint_id``): a sealed secret copied to
another endpoint's row does not open there. The endpoint, not the secret row's own id,
because the id is not known before the insert and deliveries read an endpoint's secrets
together; moving a secret among one endpoint's rows hands out nothing the endpoint's
merchant was not given.

A changed ``SECRET_KEY`` in development (whose sealing key derives from it) makes old dev
secrets unreadable: a failed attempt on delivery, never an unsigned send. Nothing here
logs or formats a secret: errors name the problem, never the value.
"""

from __future__ import annotations

import secrets as _random
import string
import threading

from django.conf import settings

from vpay.sealing import Binding, Unreadable, bound, derive_dev_key, open_bytes, parse_keys, reseal_bytes, seal_bytes

__all__ = [
    "SECRET_PREFIX",
    "SecretUnreadable",
    "binding",
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


def binding(endpoint_id: str) -> Binding:
    """What an endpoint's sealed secrets are bound to."""
    return bound("webhook_secrets", "sealed", endpoint_id)


def seal(secret: str, endpoint_id: str) -> str:
    """The secret sealed for ``endpoint_id`` with the first configured key (text, for a column)."""
    return seal_bytes(secret.encode("utf-8"), binding(endpoint_id)).decode("ascii")


def open_sealed(token: str, endpoint_id: str) -> str:
    """The secret inside ``token`` sealed for ``endpoint_id``, or :class:`SecretUnreadable`."""
    try:
        return open_bytes(token.encode("ascii"), binding(endpoint_id)).decode("utf-8")
    except (UnicodeError, ValueError):
        raise SecretUnreadable(
            "a webhook secret could not be opened for its endpoint with any configured key"
        ) from None


def reseal(token: str, endpoint_id: str) -> str:
    """``token`` sealed again under the first (current) key, bound to ``endpoint_id``."""
    try:
        return reseal_bytes(token.encode("ascii"), binding(endpoint_id)).decode("ascii")
    except (UnicodeError, ValueError):
        raise SecretUnreadable("a webhook secret could not be decrypted with any configured VPAY_SECRETS_KEY") from None


class _OpenedSecrets:
    """Decrypted signing secrets by their sealed text, per process (otherwise every attempt
    decrypts the same secret again). Keyed by the sealed text, the endpoint it is read for
    and the configured keys: a sealed text copied to another endpoint is opened (and
    refused) afresh, a rotated secret is a new row with a new sealed text, and a changed key set
    decrypts afresh, so nothing cached outlives what the database and settings say. Bounded;
    never logged (values are secrets)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: dict[tuple[str, str, tuple[str, ...], bool], str] = {}

    def open(self, sealed: str, endpoint_id: str) -> str:
        key = (sealed, endpoint_id, tuple(settings.VPAY_SECRETS_KEYS), settings.VPAY_SEALED_READ_FERNET)
        with self._lock:
            found = self._opened.get(key)
        if found is not None:
            return found
        opened = open_sealed(sealed, endpoint_id)  # SecretUnreadable is not cached: a key fix heals it
        with self._lock:
            if len(self._opened) >= self.LIMIT:
                self._opened.clear()
            self._opened[key] = opened
        return opened

    def __repr__(self) -> str:
        return f"<_OpenedSecrets: {len(self._opened)} cached>"


_OPENED = _OpenedSecrets()


def open_sealed_cached(token: str, endpoint_id: str) -> str:
    """:func:`open_sealed`, remembered per process (see :class:`_OpenedSecrets`)."""
    return _OPENED.open(token, endpoint_id)
