"""Retention of the outbox: finished deliveries with their attempts, and old events
(``sweep_expired`` steps ``retention_deliveries`` and ``retention_events``).

* A delivery goes ``VPAY_RETENTION_DELIVERIES_DAYS`` (30) after it finished (``completed_at``:
  succeeded, exhausted, refused or cancelled), with its attempts. A ``pending`` or
  ``delivering`` one is live whatever its age: its attempts are the ladder's memory.
* An event goes ``VPAY_RETENTION_EVENTS_DAYS`` (30) after it was created — the window in
  which a merchant can re-read it with ``GET /v1/events`` — once it is ``fanned_out`` and
  none of its deliveries is unfinished; its finished deliveries (and their attempts) go
  with it. A ``pending`` event has not been fanned out yet; an ``abandoned`` one waits for
  an operator's re-drive: both stay.

Windows count on the database clock. Each page is one transaction whose DELETE repeats
every guard on the rows as they are now (the page read is only a candidate list). The
events page first locks the deliveries of its events, so an operator's resend (which
moves a delivery back to ``pending``) either commits before the guard looks or waits and
then finds the delivery gone.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction

from jobs.maintenance.housekeeping import StepResult
from jobs.maintenance.paging import delete_in_pages
from jobs.runner.context import JobContext
from webhooks.models import FINISHED_STATES

PAGE = 500
FINISHED = [str(s) for s in FINISHED_STATES]


def _days(name: str) -> str:
    return f"make_interval(days => {int(getattr(settings, name))})"


def _rows(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# --- deliveries ---------------------------------------------------------------------------


def _delivery_guard() -> str:
    return f"d.state = ANY(%s) AND d.completed_at <= now() - {_days('VPAY_RETENTION_DELIVERIES_DAYS')}"


def _deliveries_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (d.completed_at, d.id) > (%s, %s)" if after else ""
    # Finished deliveries past the window, oldest first (index webhook_deliveries_finished).
    return _rows(
        f"SELECT d.completed_at, d.id FROM webhook_deliveries d WHERE {_delivery_guard()} {keyset}"
        " ORDER BY d.completed_at, d.id LIMIT %s",
        [FINISHED, *(after or ()), limit],
    )


def _delete_deliveries(ids: list) -> int:
    with transaction.atomic():
        # The page with its guards repeated (primary key), then the attempts of exactly the
        # deliveries deleted (webhook_attempts_delivery_number). A delivery reopened since
        # the read is pending now and is kept, attempts and all.
        return _rows(
            f"""
            WITH gone AS (DELETE FROM webhook_deliveries d WHERE d.id = ANY(%s) AND {_delivery_guard()} RETURNING d.id),
            attempts AS (DELETE FROM webhook_delivery_attempts a USING gone WHERE a.delivery_id = gone.id RETURNING 1)
            SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts)
            """,
            [ids, FINISHED],
        )[0][0]


def old_deliveries(ctx: JobContext) -> StepResult:
    """Sweep step ``retention_deliveries``."""
    result = delete_in_pages(ctx, read_page=_deliveries_page, delete_page=_delete_deliveries, page_size=PAGE)
    return StepResult(result.retired, more=result.more)


# --- events -------------------------------------------------------------------------------


def _event_guard() -> str:
    # Its deliveries by event (webhook_deliveries_event_id): any still unfinished?
    return (
        f"e.created_at <= now() - {_days('VPAY_RETENTION_EVENTS_DAYS')} AND e.fan_out = 'fanned_out'"
        " AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND NOT d.state = ANY(%s))"
    )


def _events_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (e.created_at, e.id) > (%s, %s)" if after else ""
    # Fanned-out events past the window with every delivery finished, oldest first
    # (index events_fanned_out_created).
    return _rows(
        f"SELECT e.created_at, e.id FROM events e WHERE {_event_guard()} {keyset} ORDER BY e.created_at, e.id LIMIT %s",
        [FINISHED, *(after or ()), limit],
    )


def _delete_events(ids: list) -> int:
    with transaction.atomic():
        # Hold the page's deliveries (by event, webhook_deliveries_event_id) so none can be
        # reopened between the guard and the delete; id order, like every other locker.
        _rows("SELECT 1 FROM webhook_deliveries WHERE event_id = ANY(%s) ORDER BY id FOR UPDATE", [ids])
        # A new statement, a new snapshot: the events with every guard re-checked (primary
        # key), then their deliveries (all finished: the guard said so, under our locks) and
        # those deliveries' attempts.
        return _rows(
            f"""
            WITH doomed AS (DELETE FROM events e WHERE e.id = ANY(%s) AND {_event_guard()} RETURNING e.id),
            gone AS (DELETE FROM webhook_deliveries d USING doomed WHERE d.event_id = doomed.id RETURNING d.id),
            attempts AS (DELETE FROM webhook_delivery_attempts a USING gone WHERE a.delivery_id = gone.id RETURNING 1)
            SELECT (SELECT count(*) FROM doomed), (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts)
            """,
            [ids, FINISHED],
        )[0][0]


def old_events(ctx: JobContext) -> StepResult:
    """Sweep step ``retention_events``."""
    result = delete_in_pages(ctx, read_page=_events_page, delete_page=_delete_events, page_size=PAGE)
    return StepResult(result.retired, more=result.more)
