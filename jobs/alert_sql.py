"""The SQL of alerts (``jobs.alerts``): one row per alert key, ever, with the
``send_alert`` job that logs and posts it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection

from jobs.repository import ALERT_JOBS, NOTIFY_ALERT_JOBS, alert_job_params, bounded

# One alert per key, ever, and its send_alert job, in the caller's transaction. A second
# raise of the same key (a retry, a racing worker) waits on the key's unique index for the
# first to commit, then inserts nothing.
_RAISE_ALERT = f"""
WITH alerted AS (
    INSERT INTO alerts (key, title, severity, source, details, link)
    VALUES (%(key)s, %(title)s, %(severity)s, %(source)s, %(details)s::jsonb, %(link)s)
    ON CONFLICT (key) DO NOTHING
    RETURNING id, %(correlation_id)s::text AS correlation_id
),
{ALERT_JOBS}
SELECT (SELECT id FROM alerted), {NOTIFY_ALERT_JOBS}
"""


def raise_alert(
    *, key: str, title: str, severity: str, source: str, details_json: str, link: str, correlation_id: str
) -> int | None:
    """Insert the alert and its send_alert job; the alert's id, or None when the key exists."""
    params = {
        "key": key,
        "title": title,
        "severity": severity,
        "source": source,
        "details": details_json,
        "link": link,
        "correlation_id": correlation_id,
        **alert_job_params(),
    }
    with connection.cursor() as cursor:
        cursor.execute(_RAISE_ALERT, params)
        return cursor.fetchone()[0]


@dataclass(frozen=True, slots=True)
class AlertRow:
    id: int
    key: str
    title: str
    severity: str
    source: str
    details: dict
    link: str
    created_at: object
    logged_at: object
    sent_at: object


_GET_ALERT = (
    "SELECT id, key, title, severity, source, details, link, created_at, logged_at, sent_at FROM alerts WHERE id = %s"
)


def get_alert(alert_id: int) -> AlertRow | None:
    with connection.cursor() as cursor:
        cursor.execute(_GET_ALERT, [alert_id])
        row = cursor.fetchone()
    if row is None:
        return None
    details = row[5] if isinstance(row[5], dict) else json.loads(row[5])
    return AlertRow(*row[:5], details, *row[6:])


_MARK_ALERT_LOGGED = "UPDATE alerts SET logged_at = now() WHERE id = %s AND logged_at IS NULL RETURNING 1"


def mark_alert_logged(alert_id: int) -> bool:
    """Compare-and-swap: True for the one caller that gets to write the alert's log line."""
    with connection.cursor() as cursor:
        cursor.execute(_MARK_ALERT_LOGGED, [alert_id])
        return cursor.fetchone() is not None


_MARK_ALERT_SENT = """
UPDATE alerts SET sent_at = now(), send_attempts = send_attempts + 1, last_error = ''
 WHERE id = %s AND sent_at IS NULL
RETURNING 1
"""


def mark_alert_sent(alert_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_MARK_ALERT_SENT, [alert_id])
        return cursor.fetchone() is not None


_ALERT_FAILED = "UPDATE alerts SET send_attempts = send_attempts + 1, last_error = %s WHERE id = %s"


def record_alert_failure(alert_id: int, error: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_ALERT_FAILED, [bounded(error), alert_id])
