"""The end of a transactional test (``django_db(transaction=True)``, ``transactional_db``, the
real-process tests): empty only the tables the test wrote, instead of Django's flush of all.

Django ends such a test with ``manage.py flush``: one ``TRUNCATE`` of every model's table,
then the ``post_migrate`` signal, which writes the content types and permissions back. On
PostgreSQL a ``TRUNCATE`` gives every table and index named a new file, so its cost grows with
the schema, not with what the test wrote: 0.32 s a test on the embedded server (590 of the
suite's tests are transactional), where most wrote to a handful of tables. Here one query
finds the tables holding rows and one ``TRUNCATE ... CASCADE`` empties them (``CASCADE``: a
table that references one of them goes too, as Django's flush would have emptied it). The
content types and permissions are left as migrations wrote them, so no ``post_migrate`` is
needed; a test that changed their number gets Django's own flush, as does any test that uses
``available_apps`` or ``serialized_rollback`` (none does today).

This replaces :meth:`TransactionTestCase._fixture_teardown`, a private method of Django's
(the measured reason above); ``tests/conftest.py`` installs it once the test databases exist.
"""

from __future__ import annotations

from django.db import connections
from django.test import testcases

# Written by migrations (post_migrate) and read by tests, never emptied between them.
KEPT = ("django_content_type", "auth_permission")

_django_flush = testcases.TransactionTestCase._fixture_teardown
_tables: dict[str, list[str]] = {}  # alias -> the model tables a flush would empty
_kept_counts: dict[str, tuple] = {}  # alias -> the KEPT tables' row counts after migrate


def _flushable(alias: str) -> list[str]:
    if alias not in _tables:
        introspection = connections[alias].introspection
        names = introspection.django_table_names(only_existing=True, include_views=False)
        _tables[alias] = sorted(t for t in names if t not in KEPT)
    return _tables[alias]


def kept_counts_after_migrate(alias: str) -> tuple:
    """The KEPT tables' row counts (in KEPT's order) as migrations left them."""
    return _kept_counts[alias]


def _kept_counts_now(cursor) -> tuple:
    cursor.execute(" UNION ALL ".join(f'SELECT count(*) FROM "{t}"' for t in KEPT))
    return tuple(row[0] for row in cursor.fetchall())


def _empty_what_was_written(self) -> None:
    aliases = self._databases_names(include_mirrors=False)
    if self.available_apps is not None or self.serialized_rollback or not set(aliases) <= _kept_counts.keys():
        return _django_flush(self)  # (it flushes every database the test used)
    for alias in aliases:
        with connections[alias].cursor() as cursor:
            if _kept_counts_now(cursor) != _kept_counts[alias]:
                return _django_flush(self)  # the test changed them: Django's flush writes them back
            # Which tables hold a row: an empty table's EXISTS reads no page.
            cursor.execute(
                " UNION ALL ".join(f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM \"{t}\")" for t in _flushable(alias))
            )
            written = [row[0] for row in cursor.fetchall()]
            if written:
                cursor.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in written) + " CASCADE")
    return None


def install() -> None:
    """Once the test databases are migrated: note what the kept tables hold, then replace the
    flush. A session whose tests use no database sets none up (the connections still name the
    development database): nothing is noted there, and a database not noted gets Django's flush."""
    for alias in connections:
        settings_dict = connections[alias].settings_dict
        if settings_dict["NAME"] == settings_dict["TEST"]["NAME"]:
            with connections[alias].cursor() as cursor:
                _kept_counts[alias] = _kept_counts_now(cursor)
    testcases.TransactionTestCase._fixture_teardown = _empty_what_was_written
