"""The end of a transactional test empties what it wrote and keeps what migrations wrote
(tests/db_flush.py). The tests run in this order, on one xdist worker: each checks what the
one before it left."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from tests import db_flush
from tests.factories import DeadLetterFactory, MerchantFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("db_flush")]


def tables_with_rows() -> list[str]:
    names = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        return [t for t in sorted(names) if t not in db_flush.KEPT and _has_rows(cursor, t)]


def _has_rows(cursor, table: str) -> bool:
    cursor.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")')
    return cursor.fetchone()[0]


def kept_counts() -> tuple[int, int]:
    return ContentType.objects.count(), Permission.objects.count()


def test_1_a_test_writes_rows_in_several_tables():
    MerchantFactory()
    DeadLetterFactory()  # its job's rows, the letter, an alert
    assert len(tables_with_rows()) >= 3


def test_2_the_next_test_finds_every_table_empty_and_the_permissions_kept():
    assert tables_with_rows() == []
    assert kept_counts() == db_flush.kept_counts_after_migrate(connection.alias)
    assert kept_counts()[1] > 0


def test_3_a_test_that_adds_a_permission():
    content_type = ContentType.objects.get_for_model(Permission)
    Permission.objects.create(codename="flush_check", name="flush check", content_type=content_type)


def test_4_the_next_test_finds_the_permissions_as_migrations_wrote_them():
    assert not Permission.objects.filter(codename="flush_check").exists()
    assert kept_counts() == db_flush.kept_counts_after_migrate(connection.alias)
