"""The queue's reads behind the operator gauges (vpay.sql_gauges): workers, dead letters
waiting for review, the fence's pressure and the tables' sizes. Each is cheap enough to run
at every scrape: a small table, a partial index, or the catalog."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection

# Workers beating within the window. `workers` holds one row per running process (the
# maintenance thread prunes the dead): a sequential scan of a handful of rows.
_WORKERS_LIVE = "SELECT count(*) FROM workers WHERE heartbeat_at > now() - make_interval(secs => %s)"


def workers_live(within_seconds: float) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_WORKERS_LIVE, [within_seconds])
        return cursor.fetchone()[0]


# Pending dead letters by kind, and how old the oldest one's job is (from its first
# enqueue: the fence horizon's clock, docs/ops-console.md). The partial index
# jobs_deadletter_pending_id holds only pending letters, a set operators keep small.
_DEAD_LETTERS_PENDING = """
SELECT kind, count(*), coalesce(extract(epoch FROM now() - min(job_created_at)), 0)::float8
  FROM dead_letters WHERE state = 'pending_review' GROUP BY kind
"""


def dead_letters_pending() -> list[tuple[str, int, float]]:
    """(kind, pending letters, seconds since the oldest one's job was first enqueued)."""
    with connection.cursor() as cursor:
        cursor.execute(_DEAD_LETTERS_PENDING)
        return cursor.fetchall()


# Live jobs whose effect already committed (a fence row exists): a job that failed after
# its effect and is retrying or deferring. If one outlives its fence row, its next run
# repeats the effect. Only jobs that have run can have committed one (attempts spent or
# refunded after a crash, deferrals), which leaves out a backlog's fresh rows; `jobs` holds
# live work only, scanned as the depth gauge scans it. The fence is read by a subquery on
# processed_jobs' primary key (job_id) per such job: never a join the planner could turn
# into a scan of processed_jobs, which holds every success of the last TTL.
_FENCED_LIVE = """
SELECT count(f.expires_at), extract(epoch FROM min(f.expires_at) - now())::float8
  FROM (SELECT (SELECT p.expires_at FROM processed_jobs p WHERE p.job_id = j.job_id) AS expires_at
          FROM jobs j
         WHERE j.attempts > 0 OR j.deferrals > 0 OR j.crashes > 0) f
"""


def fenced_live_jobs() -> tuple[int, float | None]:
    """(live jobs with a fence row, seconds until the first of those rows expires or None)."""
    with connection.cursor() as cursor:
        cursor.execute(_FENCED_LIVE)
        count, left = cursor.fetchone()
        return count, left


# Size on disk (table, indexes and TOAST) and the planner's row estimate, from the catalog:
# no table is scanned. reltuples is -1 before a table's first ANALYZE.
_TABLE_SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid), greatest(c.reltuples, 0)::bigint
  FROM pg_class c
 WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace
"""


def table_sizes(tables: Sequence[str]) -> list[tuple[str, int, int]]:
    """(table, bytes, estimated rows) for each of ``tables`` that exists."""
    with connection.cursor() as cursor:
        cursor.execute(_TABLE_SIZES, [list(tables)])
        return cursor.fetchall()
