"""Sealing values at rest, each bound to its row: AES-256-GCM keyed by ``VPAY_SECRETS_KEY``.

``VPAY_SECRETS_KEY`` is one or more comma-separated Fernet-format keys (urlsafe base64 of
32 bytes). The first seals; every one opens, so the key itself can be rotated: put the new
key first, run ``manage.py reseal``, then drop the old key. Live mode requires the setting;
in development a key is derived from ``SECRET_KEY`` so a fresh checkout works as is.

Every sealed value carries, as the AEAD's associated data, a :class:`Binding`: the table,
the column and the identity of the row it belongs to. A sealed value copied into another
row, another column or another table does not open there (:class:`Unreadable`), so
whoever can write the database but holds no key cannot move a secret to where it will be
shown or used. The AES key is derived from each configured key with HKDF, so the keys
already configured keep working.

The earlier format, Fernet without associated data (``gAAAAA…``), still opens while
``VPAY_SEALED_READ_FERNET`` is on (the default), so a database written before this format
keeps working; ``manage.py reseal`` rewrites such values in the bound format, after which
the setting can be turned off and an unbound value no longer opens anywhere.

Used for webhook signing secrets (``webhooks.sealing``), stored idempotent answers
(``api.idempotency``) and, through :class:`SealedTextField`, the payer's credentials (a
checkout session's client secret, a charge's ``pay_token`` and redirect URL). Errors name
the problem, never the value.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models
from django.db.models.query_utils import DeferredAttribute

PREFIX = b"v2."  # the bound format; a Fernet token starts with "gAAAAA" (its version byte 0x80)
_FERNET_PREFIX = b"gAAAAA"
_NONCE = 12
_TAG = 16
_HKDF_INFO = b"vpay sealed value v2: AES-256-GCM"
_UNREADABLE = "a sealed value could not be opened for its row with any configured VPAY_SECRETS_KEY"


class Unreadable(Exception):
    """A sealed value no configured key opens for this row (the message carries no value)."""


class Binding(NamedTuple):
    """What a sealed value belongs to: its table, its column and its row's identity."""

    table: str
    column: str
    row: tuple[str, ...]

    def associated_data(self) -> bytes:
        # JSON, so no choice of the parts can make two bindings spell the same bytes.
        return json.dumps(["vpay-seal-v2", self.table, self.column, *self.row], separators=(",", ":")).encode()


def bound(table: str, column: str, *row: object) -> Binding:
    """The binding of ``table.column`` in the row identified by ``row`` (its id, or its key's parts)."""
    if not row or any(part is None for part in row):
        raise ValueError(f"a value sealed in {table}.{column} needs its row's identity")
    return Binding(table, column, tuple(str(part) for part in row))


def derive_dev_key(secret_key: str) -> str:
    """A key derived from Django's ``SECRET_KEY`` (development only)."""
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


class _Ciphers(NamedTuple):
    aeads: tuple[AESGCM, ...]  # first seals
    fernet: MultiFernet  # the earlier, unbound format: opens only

    def __repr__(self) -> str:
        return f"<_Ciphers: {len(self.aeads)} keys (redacted)>"


@functools.cache
def _ciphers(keys: tuple[str, ...]) -> _Ciphers:
    def aead(key: str) -> AESGCM:
        material = base64.urlsafe_b64decode(key)
        return AESGCM(HKDF(algorithm=SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(material))

    return _Ciphers(tuple(aead(k) for k in keys), MultiFernet([Fernet(k) for k in keys]))


def _current() -> _Ciphers:
    return _ciphers(tuple(settings.VPAY_SECRETS_KEYS))


def seal_bytes(data: bytes, binding: Binding) -> bytes:
    """``data`` encrypted with the first configured key, authenticated with ``binding``."""
    nonce = os.urandom(_NONCE)
    sealed = _current().aeads[0].encrypt(nonce, data, binding.associated_data())
    return PREFIX + base64.urlsafe_b64encode(nonce + sealed)


def open_bytes(token: bytes, binding: Binding) -> bytes:
    """The bytes sealed in ``token`` for ``binding``, or :class:`Unreadable`."""
    ciphers = _current()
    if token.startswith(PREFIX):
        try:
            raw = base64.urlsafe_b64decode(token[len(PREFIX) :])
        except (binascii.Error, ValueError):
            raise Unreadable(_UNREADABLE) from None
        if len(raw) >= _NONCE + _TAG:
            for aead in ciphers.aeads:
                try:
                    return aead.decrypt(raw[:_NONCE], raw[_NONCE:], binding.associated_data())
                except InvalidTag:
                    continue
        raise Unreadable(_UNREADABLE)
    if is_fernet(token) and settings.VPAY_SEALED_READ_FERNET:
        try:
            return ciphers.fernet.decrypt(token)
        except (InvalidToken, TypeError, ValueError):
            pass
    raise Unreadable(_UNREADABLE)


def reseal_bytes(token: bytes, binding: Binding) -> bytes:
    """``token`` opened and sealed again under the first (current) key, in the bound format."""
    return seal_bytes(open_bytes(token, binding), binding)


def is_fernet(data: bytes) -> bool:
    """Whether ``data`` looks like a token of the earlier, unbound format (Fernet)."""
    return data.startswith(_FERNET_PREFIX)


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` looks like a sealed value (either format)."""
    return data.startswith(PREFIX) or is_fernet(data)


def seal_text(value: str | None, binding: Binding) -> str | None:
    """``value`` sealed for ``binding``, as text for a column (None stays None)."""
    return None if value is None else seal_bytes(value.encode("utf-8"), binding).decode("ascii")


def open_text(token: str | None, binding: Binding) -> str | None:
    """The text inside a :func:`seal_text` token (None stays None), or :class:`Unreadable`."""
    if token is None:
        return None
    try:
        return open_bytes(token.encode("ascii"), binding).decode("utf-8")
    except (UnicodeError, ValueError):
        raise Unreadable(_UNREADABLE) from None


class Sealed:
    """A :class:`SealedTextField` value as the database holds it: a token, not yet opened
    (its row is known only to the model instance that reads it)."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sealed) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)

    def __repr__(self) -> str:
        return "<Sealed (redacted)>"


def binding_of(model: type[models.Model], field_name: str, pk: object) -> Binding:
    """The binding of ``model.field_name`` in the row whose primary key is ``pk``."""
    field = model._meta.get_field(field_name)
    return bound(model._meta.db_table, field.column, pk)


def seal_for(model: type[models.Model], field_name: str, pk: object, value: str | None) -> Sealed | None:
    """``value`` sealed for that row, for ``QuerySet.update()`` (which knows no instance)."""
    return None if value is None else Sealed(seal_text(value, binding_of(model, field_name, pk)))


class _SealedAttribute(DeferredAttribute):
    """Opens the row's token on first read, with the instance's own table, column and pk."""

    def __get__(self, instance, cls=None):
        if instance is None:
            return self
        value = super().__get__(instance, cls)
        if isinstance(value, Sealed):
            value = open_text(value.token, binding_of(type(instance), self.field.name, instance.pk))
            instance.__dict__[self.field.attname] = value
        return value

    def __set__(self, instance, value) -> None:
        instance.__dict__[self.field.attname] = value


class SealedTextField(models.TextField):
    """A text column holding a value sealed for its row: sealed on save, opened when read.

    The model's primary key must be known before the insert (a default, as every vpay id
    has): it is part of what the value is bound to. ``QuerySet.update()`` knows no row, so
    it takes only a :func:`seal_for` value (or None); a plain string is refused. Sealing is
    randomized, so the column cannot be searched by value: every lookup but ``isnull`` is
    refused. Raw SQL that reads the column opens the token with :func:`open_text` and
    :func:`binding_of`; so does whoever reads it through ``values()`` / ``values_list()``,
    which hand out the :class:`Sealed` token (no instance, no row). A value sealed under a
    key that is no longer configured, or for another row, raises :class:`Unreadable` when read.
    """

    descriptor_class = _SealedAttribute

    def from_db_value(self, value, expression, connection):
        return None if value is None else Sealed(value)

    def pre_save(self, model_instance, add):
        value = model_instance.__dict__.get(self.attname)
        if isinstance(value, str):
            return Sealed(seal_text(value, binding_of(type(model_instance), self.name, model_instance.pk)))
        return value  # None, or the row's own token as read (never opened, so unchanged)

    def get_prep_value(self, value):
        if value is None or isinstance(value, Sealed):
            return None if value is None else value.token
        raise TypeError(f"{self.name} is sealed for its row: save the instance, or update() with seal_for()")

    def get_lookup(self, lookup_name):
        if lookup_name != "isnull":
            raise TypeError(f"{self.name} is sealed at rest and cannot be searched by value ({lookup_name!r})")
        return super().get_lookup(lookup_name)
