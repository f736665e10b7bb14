"""``sweep_idle_customers``: erase customers unused for 365 days.

The 365 days are a retention promise, not a tuning knob, so they are not a setting. A
customer is erased only with no live intent; that guard is contributed by the app that
owns intents (``register_in_use``), because ``customers`` must not import ``charges``.

Each customer is its own transaction: lock the row with the age guard (a concurrent
intent bumped ``last_used_at`` in its own transaction, so after the lock wait the row no
longer qualifies), then delete with the in-use guard, evaluated on a fresh snapshot, and
emit ``customer.deleted`` in the same transaction. Logs name ids only.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from customers.wire import render_deleted
from jobs import registry
from jobs.kinds import JobKind
from jobs.maintenance.paging import sweep_in_pages
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)

IDLE = "interval '365 days'"
SWEEP_EVERY_SECONDS = 3600.0

_IN_USE: dict[str, str] = {}


def register_in_use(name: str, sql_exists: str) -> None:
    """Add a guard: ``sql_exists`` is a SQL boolean over the row alias ``customers`` that is
    true while the customer is in use (e.g. ``EXISTS (SELECT 1 FROM payment_intents p WHERE
    p.customer_id = customers.id AND p.status NOT IN (…))``). Call from ``AppConfig.ready``."""
    _IN_USE[name] = sql_exists


def _not_in_use() -> str:
    return " AND ".join(f"NOT ({sql})" for sql in _IN_USE.values()) or "TRUE"


def _read_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (last_used_at, id) > (%s, %s)" if after else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT last_used_at, id FROM customers WHERE last_used_at < now() - {IDLE} AND {_not_in_use()}"
            f" {keyset} ORDER BY last_used_at, id LIMIT %s",
            [*(after or ()), limit],
        )
        return cursor.fetchall()


def erase_if_idle(customer_id: str) -> bool:
    """Erase one customer if it is still idle and unused; ``False`` when a guard failed."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT merchant_id FROM customers WHERE id = %s AND last_used_at < now() - {IDLE} FOR UPDATE",
            [customer_id],
        )
        row = cursor.fetchone()
        if row is None:
            return False
        # A new statement, a new snapshot: an intent committed while we waited is seen.
        cursor.execute(f"DELETE FROM customers WHERE id = %s AND {_not_in_use()}", [customer_id])
        if cursor.rowcount == 0:
            return False
        emit(row[0], EventType.CUSTOMER_DELETED, render_deleted(customer_id))
    return True


@registry.register(
    JobKind.SWEEP_IDLE_CUSTOMERS,
    schema=PayloadSchema(),
    timeout_seconds=300.0,
    singleton=registry.Singleton(),
)
def sweep_idle_customers(ctx: JobContext) -> Outcome:
    """One pass; reschedules at once only when a full page made progress."""
    result = sweep_in_pages(
        ctx, label="sweep_idle_customers", read_page=_read_page, retire=lambda key: erase_if_idle(key[-1])
    )
    logger.info(
        "sweep_idle_customers",
        extra={"deleted": result.retired, "failed": result.failed, "skipped": result.skipped},
    )
    if result.more:
        return Outcome.reschedule_in(0, "a full page made progress")
    return Outcome.reschedule_in(SWEEP_EVERY_SECONDS)
