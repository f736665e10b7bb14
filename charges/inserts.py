"""A new money row written by one prepared INSERT, built from its model's metadata: what
``Model.objects.create()`` writes, without the queryset's compile.

The payment intent's create and the charge's (the confirm's first commit) went through
``QuerySet.create``: a fifth of the web process's CPU under load, most of it compiling the
INSERT in Python (``bench/CHARGES.md``, py-spy of the web process). Here the statement is
built once per model and set of columns, prepared on the connection (``vpay.pipelined``),
and the columns the database fills (``db_default``) come back with it.
"""

from __future__ import annotations

from typing import TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, connection, models
from django.db.models.expressions import DatabaseDefault

from vpay.field_params import NOT_PLAIN, db_param
from vpay.pipelined import fetch_prepared

# Parameters are typed by the server from the INSERT's target columns.
_INSERT = "INSERT INTO {table} ({columns}) VALUES ({values}) RETURNING {returning}"
_SQL: dict[tuple, str] = {}

M = TypeVar("M", bound=models.Model)


def insert_row(model: type[M], **values) -> M:
    """A new ``model`` row with ``values`` (field names, related objects as ``create()``
    takes them), its Python defaults applied and its database defaults read back: the
    instance ``model.objects.create(**values)`` would return. In the caller's transaction
    (a failure marks it for rollback, as a queryset's write does), else alone in autocommit.
    Like ``bulk_create()``, it sends no ``pre_save``/``post_save`` signal (the two money rows
    it writes have no receiver: tests/test_charge_inserts.py). What this path cannot write
    exactly as the ORM would (a value type outside the plain ones, a generated column, a
    database default needing a converter) is saved through the ORM."""
    instance = model(**values)
    meta = model._meta
    columns: list[str] = []
    params: dict[str, object] = {}
    returned: list[models.Field] = []
    for field in meta.concrete_fields:
        _refuse_unsaved_related(instance, field)
        value = getattr(instance, field.attname)
        if isinstance(value, DatabaseDefault):
            if hasattr(field, "from_db_value"):  # its value would come back unconverted
                return _saved(instance)
            returned.append(field)
            continue
        if getattr(field, "generated", False) or (value is None and field.primary_key):
            return _saved(instance)  # the ORM leaves these to the database
        # As the ORM's INSERT takes it: pre_save (a sealed value's seal), then prepared.
        db_value = db_param(field, field.pre_save(instance, add=True), connection)
        if db_value is NOT_PLAIN:
            return _saved(instance)
        params[f"v{len(columns)}"] = db_value
        columns.append(_column(field))
    key = (meta.label, tuple(columns), tuple(_column(f) for f in returned))
    sql = _SQL.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sql = _SQL[key] = _INSERT.format(
            table=quote(meta.db_table),
            columns=", ".join(quote(c) for c in columns),
            values=", ".join(f"%(v{i})s" for i in range(len(columns))),
            returning=", ".join(quote(_column(f)) for f in returned) or "1",
        )
    ((*row,),) = fetch_prepared(sql, params)
    for field, value in zip(returned, row if returned else (), strict=True):
        setattr(instance, field.attname, value)
    # As save() leaves it (Model._state is documented: "Other model instance attributes").
    instance._state.adding = False
    instance._state.db = DEFAULT_DB_ALIAS
    return instance


def _column(field: models.Field) -> str:
    return cast(str, field.column)  # a concrete field's: never None


def _saved(instance: M) -> M:
    instance.save(force_insert=True)
    return instance


def _refuse_unsaved_related(instance: models.Model, field: models.Field) -> None:
    """As ``save()`` refuses it: a related object without a primary key would be written as
    NULL (Django's own check is a private method of the model)."""
    if isinstance(field, models.ForeignKey) and field.is_cached(instance):
        related = getattr(instance, field.name)
        if related is not None and related.pk is None:
            raise ValueError(f"save() prohibited to prevent data loss due to unsaved related object '{field.name}'.")
