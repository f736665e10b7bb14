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

from jobs.maintenance import statistics
from tests.conftest import database_url
from tests.queue_support import execute, insert_due_jobs, scalar

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
        insert_due_jobs(conn, n, prefix="grown")


def wait_for_live_rows(table: str, n: int) -> None:
    deadline = time.monotonic() + 20
    while (scalar("SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = %s", [table]) or 0) < n:
        assert time.monotonic() < deadline, f"the statistics never counted {n} rows in {table}"
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def no_autovacuum_on_jobs():
    """Autovacuum (on in the embedded server) analyzing jobs between a fill and an assertion
    would do this module's work for it."""
    execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
    yield
    execute("ALTER TABLE jobs RESET (autovacuum_enabled)")


def reltuples(table: str) -> float:
    return scalar("SELECT reltuples FROM pg_class WHERE relname = %s", [table])


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
        assert reltuples("jobs") >= ROWS
    assert "jobs" not in statistics.analyze_grown_tables()  # its statistics are current now


def test_a_table_whose_statistics_are_current_is_left_alone():
    fill_jobs(ROWS)
    wait_for_live_rows("jobs", ROWS)  # counted before the ANALYZE, not added after it
    execute("ANALYZE jobs")
    assert "jobs" not in statistics.analyze_grown_tables()


def test_one_worker_analyzes_at_a_time_and_the_others_skip_the_turn():
    execute("ANALYZE jobs")
    fill_jobs(ROWS)
    wait_for_live_rows("jobs", ROWS)
    turn = "hashtextextended('vpay:analyze_grown_tables', 0)"
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute(f"SELECT pg_advisory_lock({turn})")
        assert statistics.analyze_grown_tables() == []
        assert reltuples("jobs") < ROWS  # nobody analyzed it
        other.execute(f"SELECT pg_advisory_unlock({turn})")  # not left to the backend's exit
        assert "jobs" in statistics.analyze_grown_tables()


def test_a_table_whose_lock_is_held_is_left_for_a_later_turn_without_waiting():
    """Behind a migration's or a TRUNCATE's lock the ANALYZE gives up at once; the maintenance
    thread goes on, and the table is analyzed once the lock is gone."""
    execute("ANALYZE jobs")
    fill_jobs(ROWS)
    wait_for_live_rows("jobs", ROWS)
    with psycopg.connect(database_url()) as migration:
        migration.execute("LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE")
        started = time.monotonic()
        assert "jobs" not in statistics.analyze_grown_tables()
        assert time.monotonic() - started < 5
        migration.rollback()
    assert "jobs" in statistics.analyze_grown_tables()


def test_a_table_the_role_may_not_analyze_is_not_asked_about():
    """ANALYZE of another owner's table is skipped by the server with a warning the client
    never sees; asked about every second it would be "analyzed" forever."""
    execute("ANALYZE jobs")
    fill_jobs(ROWS)
    wait_for_live_rows("jobs", ROWS)
    # Roles are the server's, not the database's: one name per test database (xdist). It
    # needs no grant: the statistics views and catalogs are readable by every role.
    role = scalar("SELECT quote_ident(left(current_database(), 50) || '_not_owner')")
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role}")
        try:
            execute(f"SET ROLE {role}")
            try:
                assert statistics.analyze_grown_tables() == []
            finally:
                execute("RESET ROLE")
            assert reltuples("jobs") < ROWS
        finally:
            admin.execute(f"DROP ROLE {role}")
