"""Retention of rail requests (``provider_requests``): a ``sweep_expired`` step.

A request row is the evidence crash recovery and an operator reconciling a charge read, so
it is kept while its charge is live (``submitting``, ``submitted``, ``unresolved``: still
polled, still recoverable, however old), and a refund's while the refund is (``submitting``,
``pending``, ``unresolved``: its recovery asks the rail rather than send again because of
them; its ``charge`` is the refunded, succeeded charge, which says nothing), and then for ``VPAY_RETENTION_PROVIDER_REQUESTS_DAYS``
(90 by default) after it was sent, on the database clock. Pages by keyset with the step's
cursor in the sweep's checkpoint; each page is one DELETE that repeats every guard, so a
charge that went live again (it cannot today, but the guard does not rely on that) or a
request whose age was misread keeps its rows.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from charges.states import CHARGE_LIVE, REFUND_LIVE
from jobs.maintenance.housekeeping import StepResult
from jobs.maintenance.paging import delete_in_pages
from jobs.runner.context import JobContext

PAGE = 1000
_LIVE = sorted(CHARGE_LIVE)
_REFUND_LIVE = sorted(REFUND_LIVE)


def _guard() -> str:
    days = int(settings.VPAY_RETENTION_PROVIDER_REQUESTS_DAYS)
    # The charge, and the refund if it is a refund's request, by primary key: is it settled?
    return (
        f"r.sent_at <= now() - make_interval(days => {days})"
        " AND NOT EXISTS (SELECT 1 FROM charges c WHERE c.id = r.charge_id AND c.status = ANY(%s))"
        " AND NOT EXISTS (SELECT 1 FROM refunds f WHERE f.id = r.refund_id AND f.status = ANY(%s))"
    )


def _read_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (r.sent_at, r.id) > (%s, %s)" if after else ""
    with connection.cursor() as cursor:
        # Old requests of settled charges and refunds, oldest first (index provider_requests_sent).
        cursor.execute(
            f"SELECT r.sent_at, r.id FROM provider_requests r WHERE {_guard()} {keyset}"
            " ORDER BY r.sent_at, r.id LIMIT %s",
            [_LIVE, _REFUND_LIVE, *(after or ()), limit],
        )
        return cursor.fetchall()


def _delete_page(ids: list) -> int:
    with connection.cursor() as cursor:
        # The page, every guard repeated on the rows as they are now (primary key).
        cursor.execute(f"DELETE FROM provider_requests r WHERE r.id = ANY(%s) AND {_guard()}", [ids, _LIVE, _REFUND_LIVE])
        return cursor.rowcount


def old_provider_requests(ctx: JobContext) -> StepResult:
    """Sweep step ``retention_provider_requests``."""
    result = delete_in_pages(ctx, read_page=_read_page, delete_page=_delete_page, page_size=PAGE)
    return StepResult(result.retired, more=result.more)
