"""The webhook reads behind the operator gauges (vpay.sql_gauges). Each counts rows of a
partial index, which holds only the rows counted."""

from __future__ import annotations

from django.db import connection

# Events waiting for the outbox drain, and the oldest one's age (index events_pending_fan_out).
_PENDING_FAN_OUT = """
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
  FROM events WHERE fan_out = 'pending'
"""


def pending_fan_out() -> tuple[int, float]:
    with connection.cursor() as cursor:
        cursor.execute(_PENDING_FAN_OUT)
        return cursor.fetchone()


# Events abandoned and not re-driven (index events_abandoned).
_ABANDONED = "SELECT count(*) FROM events WHERE fan_out = 'abandoned'"


def abandoned_events() -> int:
    with connection.cursor() as cursor:
        cursor.execute(_ABANDONED)
        return cursor.fetchone()[0]


# Deliveries waiting for their next attempt (index webhook_deliveries_due).
_PENDING_DELIVERIES = "SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'"


def pending_deliveries() -> int:
    with connection.cursor() as cursor:
        cursor.execute(_PENDING_DELIVERIES)
        return cursor.fetchone()[0]


# Deliveries that ended exhausted or refused within the window and are still so (a resend
# moves one back to pending): index webhook_deliveries_failed, on completed_at.
_FAILED_RECENTLY = """
SELECT state, count(*) FROM webhook_deliveries
 WHERE state IN ('exhausted', 'refused') AND completed_at > now() - make_interval(secs => %s)
 GROUP BY state
"""


def failed_recently(within_seconds: float) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(_FAILED_RECENTLY, [within_seconds])
        return dict(cursor.fetchall())
