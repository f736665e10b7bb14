"""Retention of the queue's evidence: settled dead letters and old alerts (``sweep_expired`` steps).

Windows are settings (``VPAY_RETENTION_DEAD_LETTERS_DAYS``, ``VPAY_RETENTION_ALERTS_DAYS``,
90 days by default), counted on the database clock. What is still live is never deleted,
whatever its age:

* a dead letter ``pending_review`` (a human has not decided yet); only replayed or
  discarded ones go, counted from the replay or the discard;
* an alert whose ``send_alert`` job is still queued, or whose job is a dead letter awaiting
  review (its replay would find nothing to send), or that was never logged.

Both page by keyset (``jobs.maintenance.paging.delete_in_pages``) with the step's cursor in the sweep's
checkpoint, and each page is one DELETE that repeats every guard, so a row that changed
between the read and the delete is judged again on what it is now.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from jobs.maintenance.housekeeping import StepResult
from jobs.maintenance.paging import delete_in_pages
from jobs.runner.context import JobContext

PAGE = 1000


def _days(name: str) -> str:
    return f"make_interval(days => {int(getattr(settings, name))})"


def _rows(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _count(sql: str, params: list) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# --- dead letters -------------------------------------------------------------------------

_SETTLED_AT = "COALESCE(replayed_at, discarded_at)"


def _settled_letter_guard() -> str:
    return (
        f"state IN ('replayed', 'discarded') AND {_SETTLED_AT} <= now() - {_days('VPAY_RETENTION_DEAD_LETTERS_DAYS')}"
    )


def _letters_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = f"AND ({_SETTLED_AT}, id) > (%s, %s)" if after else ""
    # Settled letters past the window, oldest settlement first (index jobs_deadletter_settled).
    return _rows(
        f"SELECT {_SETTLED_AT}, id FROM dead_letters WHERE {_settled_letter_guard()} {keyset}"
        f" ORDER BY {_SETTLED_AT}, id LIMIT %s",
        [*(after or ()), limit],
    )


def _delete_letters(ids: list) -> int:
    # The page, guards repeated on the row as it is now (primary key).
    return _count(f"DELETE FROM dead_letters WHERE id = ANY(%s) AND {_settled_letter_guard()}", [ids])


def settled_dead_letters(ctx: JobContext) -> StepResult:
    """Sweep step ``retention_dead_letters``."""
    result = delete_in_pages(ctx, read_page=_letters_page, delete_page=_delete_letters, page_size=PAGE)
    return StepResult(result.retired, more=result.more)


# --- alerts -------------------------------------------------------------------------------


def _old_alert_guard() -> str:
    # A send_alert job (live, or dead-lettered and awaiting review) still refers to it by
    # id; jobs.kind and dead_letters' pending index keep these probes small.
    return (
        f"alerts.created_at <= now() - {_days('VPAY_RETENTION_ALERTS_DAYS')} AND alerts.logged_at IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'send_alert'"
        " AND j.payload->>'alert_id' = alerts.id::text)"
        " AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.state = 'pending_review'"
        " AND d.kind = 'send_alert' AND d.payload->>'alert_id' = alerts.id::text)"
    )


def _alerts_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (alerts.created_at, alerts.id) > (%s, %s)" if after else ""
    # Old alerts nothing refers to, oldest first (index jobs_alert_created).
    return _rows(
        f"SELECT alerts.created_at, alerts.id FROM alerts WHERE {_old_alert_guard()} {keyset}"
        " ORDER BY alerts.created_at, alerts.id LIMIT %s",
        [*(after or ()), limit],
    )


def _delete_alerts(ids: list) -> int:
    # The page, guards repeated on the row as it is now (primary key).
    return _count(f"DELETE FROM alerts WHERE alerts.id = ANY(%s) AND {_old_alert_guard()}", [ids])


def old_alerts(ctx: JobContext) -> StepResult:
    """Sweep step ``retention_alerts``."""
    result = delete_in_pages(ctx, read_page=_alerts_page, delete_page=_delete_alerts, page_size=PAGE)
    return StepResult(result.retired, more=result.more)
