"""The SQL of alerts (``jobs.operator.alerts``): one row per alert key, ever, with the
``send_alert`` job that logs and posts it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from jobs.storage.repository import ALERT_JOBS, NOTIFY_ALERT_JOBS, alert_job_params, bounded

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
    created_at: datetime
    logged_at: datetime | None
    sent_at: datetime | None


_GET_ALERT = (
    "SELECT id, key, title, severity, source, details, link, created_at, logged_at, sent_at FROM alerts WHERE id = %s"
)


def get_alert(alert_id: int) -> AlertRow | None:
    with connection.cursor() as cursor:
        cursor.execute(_GET_ALERT, [alert_id])
        row = cursor.fetchone()
    if row is None:
        return None
    alert_id, key, title, severity, source, details, link, created_at, logged_at, sent_at = row
    details = details if isinstance(details, dict) else json.loads(details)
    return AlertRow(alert_id, key, title, severity, source, details, link, created_at, logged_at, sent_at)


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


# Occurrences of one thing about one subject (a webhook endpoint's refused deliveries),
# folded per period of the database clock (period n: [n * period, (n + 1) * period) in
# epoch seconds), so whoever causes them (a merchant) cannot flood the pager. The period's
# first occurrence is an alert of its own, sent at once (key ``<key>:<n>``); every later one
# is counted on the period's tally (key ``<key>:<n>:more``), inserted by the second
# occurrence with its send_alert job due when the period ends, and counted up by the rest.
# Racing raisers wait on the key's unique index (the first) or the tally's row (the others),
# so each occurrence is counted once. Both inserts go through ``alerts_key_key``.
_RAISE_COUNTED_ALERT = f"""
WITH period AS (
    SELECT n, to_timestamp(n * %(period)s) AS starts, to_timestamp((n + 1) * %(period)s) AS ends
      FROM (SELECT floor(extract(epoch FROM now()) / %(period)s)::bigint AS n) p
),
first AS (
    INSERT INTO alerts (key, title, severity, source, details, link)
    SELECT %(key)s || ':' || n, %(title)s, %(severity)s, %(source)s,
           %(details)s::jsonb || jsonb_build_object('count', 1, 'period_start', starts, 'period_end', ends,
                                                    'first', %(occurrence)s::jsonb),
           %(link)s
      FROM period
    ON CONFLICT (key) DO NOTHING
    RETURNING id
),
more AS (
    INSERT INTO alerts AS a (key, title, severity, source, details, link)
    SELECT %(key)s || ':' || n || ':more', %(more_title)s, %(severity)s, %(source)s,
           %(details)s::jsonb || jsonb_build_object('count', 1, 'period_start', starts, 'period_end', ends,
                                                    'latest', %(occurrence)s::jsonb),
           %(link)s
      FROM period
     WHERE NOT EXISTS (SELECT 1 FROM first)
    ON CONFLICT (key) DO UPDATE
       SET details = a.details || jsonb_build_object('count', (a.details ->> 'count')::int + 1,
                                                     'latest', EXCLUDED.details -> 'latest')
    RETURNING id, xmax = 0 AS inserted
),
alerted AS (
    SELECT id, now() AS run_at, %(correlation_id)s::text AS correlation_id FROM first
    UNION ALL
    SELECT more.id, period.ends, %(correlation_id)s::text FROM more, period WHERE more.inserted
),
alert_jobs AS (
    INSERT INTO jobs (kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id, run_at)
    SELECT 'send_alert', %(alert_queue)s, jsonb_build_object('alert_id', a.id), %(alert_priority)s,
           %(alert_max_attempts)s, 'alert:' || a.id, a.correlation_id, a.run_at
      FROM alerted a
    ON CONFLICT DO NOTHING
    RETURNING queue
)
SELECT (SELECT id FROM first), (SELECT id FROM more), {NOTIFY_ALERT_JOBS}
"""


def raise_counted_alert(
    *,
    key: str,
    period: float,
    title: str,
    more_title: str,
    severity: str,
    source: str,
    details_json: str,
    occurrence_json: str,
    link: str,
    correlation_id: str,
) -> tuple[int | None, int | None]:
    """Count one occurrence (see ``_RAISE_COUNTED_ALERT``): ``(first alert's id, None)`` when
    it is the period's first, ``(None, tally's id)`` otherwise."""
    params = {
        "key": key,
        "period": period,
        "title": title,
        "more_title": more_title,
        "severity": severity,
        "source": source,
        "details": details_json,
        "occurrence": occurrence_json,
        "link": link,
        "correlation_id": correlation_id,
        **alert_job_params(),
    }
    with connection.cursor() as cursor:
        cursor.execute(_RAISE_COUNTED_ALERT, params)
        first, more, _ = cursor.fetchone()
        return first, more
