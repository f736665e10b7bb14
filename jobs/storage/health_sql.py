"""The queue's health, read on the database clock: depth by queue and kind and the oldest
claimable age (the worker's gauges, the admin's queue page)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

_OLDEST_CLAIMABLE_AGE = """
SELECT coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8
  FROM jobs WHERE locked_at IS NULL AND run_at <= now()
"""


def oldest_claimable_age() -> float:
    """Seconds the longest-waiting claimable job has been due (0 when none), on the DB clock."""
    with connection.cursor() as cursor:
        cursor.execute(_OLDEST_CLAIMABLE_AGE)
        return cursor.fetchone()[0]


_DEPTH = """
SELECT queue, kind, count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now()),
       count(*) FILTER (WHERE locked_at IS NOT NULL), count(*)
  FROM jobs GROUP BY queue, kind
"""


def depth() -> list[tuple[str, str, int, int, int]]:
    """(queue, kind, claimable, leased, total) for every queue and kind with rows."""
    with connection.cursor() as cursor:
        cursor.execute(_DEPTH)
        return cursor.fetchall()


_QUEUE_SUMMARY = """
SELECT queue, kind,
       count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now()),
       count(*) FILTER (WHERE locked_at IS NULL AND run_at > now()),
       count(*) FILTER (WHERE locked_at IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE locked_at IS NULL AND run_at <= now())), 0)::float8
  FROM jobs GROUP BY queue, kind ORDER BY queue, kind
"""


@dataclass(frozen=True, slots=True)
class QueueDepth:
    queue: str
    kind: str
    claimable: int
    scheduled: int  # waiting for a run_at in the future
    leased: int
    oldest_claimable_seconds: float  # how long the longest-waiting claimable job has been due


def queue_summary() -> list[QueueDepth]:
    """Depth by queue and kind, and each one's oldest claimable age, all on the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(_QUEUE_SUMMARY)
        return [QueueDepth(*row) for row in cursor.fetchall()]
