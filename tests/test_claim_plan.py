"""The claim is planned once per connection (generic): its plan over a backlog must still take
the chosen rows by primary key, never read the whole queue (jobs.storage.leases.CLAIM)."""

from __future__ import annotations

import re

import psycopg
import pytest

from jobs.kinds import JobKind
from jobs.storage.leases import CLAIM
from tests.conftest import database_url
from tests.queue_support import insert_due_jobs

pytestmark = pytest.mark.django_db(transaction=True)  # the backlog is analyzed, as autovacuum would

BACKLOG = 6000  # due jobs across three tenants


def _literal(value) -> str:
    if isinstance(value, list):  # names (text), or job ids (skip: bigint)
        if all(isinstance(v, int) for v in value):
            return "ARRAY[" + ",".join(str(v) for v in value) + "]::bigint[]"
        return "ARRAY[" + ",".join(f"'{v}'" for v in value) + "]::text[]"
    if value is None:
        return "NULL"
    return f"'{value}'" if isinstance(value, str) else str(value)


def generic_plan(conn: psycopg.Connection, params: dict) -> str:
    """EXPLAIN of CLAIM prepared under ``force_generic_plan`` (its parameters numbered in the
    order they first appear, as vpay.pipelined sends it)."""
    order: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("PREPARE claim AS " + re.sub(r"%\((\w+)\)s", number, CLAIM))
    args = ", ".join(_literal(params[name]) for name in order)
    return "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE claim({args})"))


def test_the_claim_s_generic_plan_over_a_backlog_updates_its_rows_by_primary_key():
    with psycopg.connect(database_url(), autocommit=True) as conn:
        insert_due_jobs(conn, BACKLOG, prefix="backlog", tenants=3)
        conn.execute("ANALYZE jobs")
        plan = generic_plan(
            conn,
            {
                "worker": "w",
                "queues": ["default"],
                "kinds": [JobKind.TASK.value],
                "batch": 4,
                "lease": None,
                "leases": "{}",
                "default_lease": 30.0,
                "after": "",
                "max_tenants": 8,
                "skip": [],
            },
        )
    assert "Seq Scan on jobs" not in plan, plan
    assert "Index Scan using jobs_pkey on jobs j" in plan, plan
