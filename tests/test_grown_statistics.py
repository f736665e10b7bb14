"""A table that grew far past its statistics is analyzed by the worker's maintenance, and the
plans prepared on the old statistics are made again (jobs.maintenance.statistics).

The plan checked is one the queue really keeps: a key probe of ``jobs`` through an array of
names, prepared generic on a connection while the table was empty. On the empty table's
statistics it reads the whole table for every call; after the refresh it probes the unique
index."""

from __future__ import annotations

import time

import psycopg
import pytest

from jobs.kinds import JobKind
from jobs.maintenance import statistics
from tests.conftest import database_url
from tests.queue_support import execute, scalar

pytestmark = pytest.mark.django_db(transaction=True)  # ANALYZE and the statistics see commits

ROWS = 6000  # where probing ten names costs less than reading the table, by the planner's own costs

# The hold's shape (jobs.storage.held_sql): names in an array, each matched to a job.
_PROBE = """
PREPARE probe(text[]) AS
SELECT j.id FROM jobs j JOIN unnest($1::text[]) AS k(name) ON j.dedupe_key = k.name
 WHERE j.locked_at IS NULL
"""


def plan(conn: psycopg.Connection) -> str:
    return "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE probe('{a,b}')"))


def fill_jobs(n: int) -> None:
    """``n`` jobs committed from a connection of their own, which reports its counts to the
    statistics as it closes (a backend may otherwise hold them for seconds)."""
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (job_id, kind, queue, payload, priority, run_at, max_attempts, dedupe_key)"
            " SELECT gen_random_uuid(), %s, 'default', '{}', 0, now(), 5, 'grown:' || g"
            "   FROM generate_series(1, %s) g",
            [JobKind.TASK.value, n],
        )


def wait_for_live_rows(table: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while (scalar("SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = %s", [table]) or 0) < n:
        assert time.monotonic() < deadline, f"the statistics never counted {n} rows in {table}"
        time.sleep(0.1)


def test_a_table_grown_past_its_statistics_is_analyzed_and_its_cached_plans_made_again():
    execute("ANALYZE jobs")  # the statistics of an empty queue, as after a quiet hour
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(_PROBE)
        assert "Seq Scan on jobs" in plan(conn)  # an empty table: the cheapest plan reads it all
        fill_jobs(ROWS)
        wait_for_live_rows("jobs", ROWS)
        assert "Seq Scan on jobs" in plan(conn)  # kept: nothing told the plan the table grew

        assert "jobs" in statistics.analyze_grown_tables()

        assert "jobs_job_dedupe_key_unique" in plan(conn)  # made again, on statistics of 6,000 rows
        assert scalar("SELECT reltuples FROM pg_class WHERE relname = 'jobs'") >= ROWS
    assert "jobs" not in statistics.analyze_grown_tables()  # its statistics are current now


def test_a_table_whose_statistics_are_current_is_left_alone():
    fill_jobs(ROWS)
    execute("ANALYZE jobs")
    wait_for_live_rows("jobs", ROWS)
    assert "jobs" not in statistics.analyze_grown_tables()


def test_one_worker_analyzes_at_a_time_and_the_others_skip_the_turn():
    execute("ANALYZE jobs")
    fill_jobs(ROWS)
    wait_for_live_rows("jobs", ROWS)
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtextextended('vpay:analyze_grown_tables', 0))")
        assert statistics.analyze_grown_tables() == []
    assert "jobs" in statistics.analyze_grown_tables()
