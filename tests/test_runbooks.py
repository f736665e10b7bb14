"""Every runbook's first query runs against vpay's schema (the test database, migrated),
so the query an operator pastes at 3 a.m. is one that works."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from tests.monitoring_support import first_query, runbook_pages


def test_there_is_a_runbook_page_per_alert():
    assert len(runbook_pages()) >= 20


@pytest.mark.django_db
@pytest.mark.parametrize("page", runbook_pages(), ids=lambda p: p.stem)
def test_the_first_query_of_the_runbook_runs(page):
    sql = first_query(page)
    # Read-only, like what an operator should paste first; run in a read-only transaction
    # so a query that wrote would fail here.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
        cursor.execute(sql)
        assert cursor.description, f"{page.name}: the first query returns no columns"
        cursor.fetchall()
