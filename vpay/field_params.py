"""A model field's value as a parameter of a hand-written prepared statement: what the ORM's
own write would send for it, or :data:`NOT_PLAIN` where such a statement cannot send it
exactly (the caller then writes through the ORM). Shared by the guarded status write
(``charges.guarded.cas``, as ``update()`` would) and the prepared insert
(``charges.inserts.insert_row``, as ``save()`` would)."""

from __future__ import annotations

import json
import uuid

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

NOT_PLAIN = object()
# What vpay.prepared.text_param sends; any other prepared value (a date, a decimal, bytes,
# psycopg's JSON wrapper) is NOT_PLAIN.
_PLAIN = (str, int, float, bool, uuid.UUID, type(None))


def db_param(field: models.Field, value, connection: BaseDatabaseWrapper) -> object:
    """``value`` prepared for ``field`` as the ORM prepares it (``get_db_prep_save``: a
    sealed value's token, a choice's text), as a plain type; a JSON value as its JSON text
    (None as SQL NULL, as the ORM writes it); NOT_PLAIN for an expression, a model
    instance, or what prepares to another type."""
    if hasattr(value, "resolve_expression") or hasattr(value, "_meta"):
        return NOT_PLAIN
    if isinstance(field, models.JSONField):
        return None if value is None else json.dumps(value, cls=field.encoder)
    prepared = field.get_db_prep_save(value, connection)
    if not isinstance(prepared, _PLAIN):
        return NOT_PLAIN
    if isinstance(prepared, str):
        return str(prepared)  # a str subclass (a choice) as its text
    if isinstance(prepared, int) and not isinstance(prepared, bool):
        return int(prepared)  # psycopg's Int4 or Int8, as Django's backend prepares an integer
    return prepared
