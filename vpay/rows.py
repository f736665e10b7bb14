"""Model instances from hand-written SQL: the columns to select for a model, and the instance
built from such a row exactly as the ORM builds it (each field's database converters, then
``Model.from_db``), without compiling a queryset. For the hot paths that measured the
compile (bench/CHARGES.md, "The web process's confirm")."""

from __future__ import annotations

from typing import TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def columns_of(model: type[Model], alias: str) -> str:
    """``alias.column, …`` for every concrete field of ``model``, in model order."""
    return ", ".join(f"{alias}.{field.column}" for field in model._meta.concrete_fields)


def from_row(model: type[M], row) -> M:
    """``model`` from a row of :func:`columns_of`'s columns: each value through its field's
    converters (a JSON document parsed, a sealed column wrapped), as the ORM's compiler does."""
    fields = model._meta.concrete_fields
    values = []
    for field, value in zip(fields, row, strict=True):
        for converter in field.get_db_converters(connection):
            value = converter(value, None, connection)
        values.append(value)
    return model.from_db(connection.alias, [field.attname for field in fields], values)
