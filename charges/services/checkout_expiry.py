"""Checkout sessions past their 24 hours: ``open → expired``, a step of ``sweep_expired``.

Payment status is never touched: an expired session says nothing about money. A session
whose intent has a live charge is skipped by a guard inside the UPDATE (the payer may be
paying right now; the charge settles it). Each session is its own transaction, so one
failing session is logged by id and skipped while the rest of the page expires, and the
state compare-and-swap (``status = 'open'`` in the WHERE) means two sweeps racing expire a
session once and emit one ``checkout.session.expired`` event. The event's object carries
no URL and no client secret: the session can no longer be paid, and the event outlives it.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models.functions import Now

from charges.models import CheckoutSession
from charges.states import CHARGE_LIVE, CheckoutSessionStatus
from charges.wire import render_session
from jobs.maintenance.housekeeping import StepResult
from jobs.maintenance.paging import sweep_in_pages
from jobs.runner.context import JobContext
from webhooks.event_types import EventType
from webhooks.events import emit

_LIVE = sorted(CHARGE_LIVE)


def _read_page(after: tuple | None, limit: int) -> list[tuple]:
    keyset = "AND (expires_at, id) > (%s, %s)" if after else ""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at, id FROM checkout_sessions WHERE status = %s AND expires_at <= now()"
            f" {keyset} ORDER BY expires_at, id LIMIT %s",
            [CheckoutSessionStatus.OPEN, *(after or ()), limit],
        )
        return cursor.fetchall()


def expire_session(session_id: str) -> bool:
    """Expire one session if it is still open, past its time, and its intent has no live
    charge; emit its event in the same transaction. ``False``: a guard no longer held."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Lock the intent first: a confirm holding it commits its charge before we look,
            # and a confirm arriving after waits for this transaction to finish.
            cursor.execute(
                "SELECT 1 FROM payment_intents WHERE id = (SELECT intent_id FROM checkout_sessions WHERE id = %s)"
                " FOR UPDATE",
                [session_id],
            )
            cursor.execute(
                "UPDATE checkout_sessions s SET status = %s, expired_at = now()"
                " WHERE s.id = %s AND s.status = %s AND s.expires_at <= now()"
                " AND NOT EXISTS (SELECT 1 FROM charges c WHERE c.intent_id = s.intent_id AND c.status = ANY(%s))",
                [CheckoutSessionStatus.EXPIRED, session_id, CheckoutSessionStatus.OPEN, _LIVE],
            )
            if cursor.rowcount == 0:
                return False
        session = CheckoutSession.objects.select_related("intent").get(id=session_id)
        emit(session.merchant_id, EventType.CHECKOUT_SESSION_EXPIRED, render_session(session, for_event=True))
    return True


def expire_session_of_canceled_intent(intent_id: str) -> CheckoutSession | None:
    """The intent was canceled (in the caller's transaction, holding its row lock): its open
    session can no longer be paid, so it expires now, whatever its ``expires_at``, and its
    ``checkout.session.expired`` is emitted in the same transaction. None if it had no open
    session."""
    if not connection.in_atomic_block:
        raise RuntimeError("a canceled intent's session expires in the cancel's transaction")
    moved = CheckoutSession.objects.filter(intent_id=intent_id, status=CheckoutSessionStatus.OPEN).update(
        status=CheckoutSessionStatus.EXPIRED, expired_at=Now()
    )
    if not moved:
        return None
    session = CheckoutSession.objects.select_related("intent").get(intent_id=intent_id)
    emit(session.merchant_id, EventType.CHECKOUT_SESSION_EXPIRED, render_session(session, for_event=True))
    return session


def expire_checkout_sessions(ctx: JobContext) -> StepResult:
    """The sweep step: pages of 100, a transaction per session, failures isolated."""
    result = sweep_in_pages(
        ctx, label="checkout_sessions", read_page=_read_page, retire=lambda key: expire_session(key[-1])
    )
    return StepResult(result.retired, more=result.more, failed=result.failed)
