"""Refunds: the create (web process) and the transitions the worker makes, each one
transaction with the event that reports it.

The create is the only place a refund is accepted, and it holds the intent's row lock
(``guarded.lock_intent``) from reading what is left to writing the new total:
two refunds racing for the same intent serialize there, and the second reads the first's
total. It writes the refund ``submitting`` and its poll job in the same transaction; the
worker sends it to the rail (``refund_polling``), so no web request ever waits on a rail
for a refund and a crash anywhere leaves a job that finds it.
"""

from __future__ import annotations

import logging

from django.db import transaction

from charges import guarded, money, refund_repository
from charges.metrics import REFUNDS_SETTLED, REFUNDS_UNRESOLVED
from charges.models import Charge, Refund
from charges.rails import get_rail
from charges.refund_repository import RefundRow
from charges.states import CaptureMethod, ChargeStatus, IntentStatus, RefundReason, RefundStatus
from charges.wire import render_charge, render_refund
from jobs import port as queue
from jobs.kinds import JobKind
from jobs.operator.alerts import Severity, admin_path, raise_alert
from merchants.models import Merchant
from vpay.errors import InvalidInput, InvalidState, NotFound
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)

# Failure codes vpay itself gives a refund (a rail's own come from its answer).
REFUND_REJECTED = "rail_rejected"


def refund_create(
    *,
    merchant: Merchant,
    payment_intent: str,
    amount: int | None = None,
    reason: RefundReason | str | None = None,
) -> Refund:
    """Accept a refund of ``amount`` (default: all that is left) of a succeeded intent.

    Refuses, writing nothing: ``NotFound`` (no such intent for this merchant),
    ``InvalidState`` (the intent has not succeeded; its rail is gone), ``InvalidInput``
    (``amount`` outside the currency's bounds, nothing left to refund, or ``amount`` more
    than what is left)."""
    with transaction.atomic():
        intent = guarded.lock_intent(payment_intent, merchant_id=merchant.id)
        if intent is None:
            raise NotFound("resource_missing", f"No such payment_intent: {payment_intent!r}.", param="payment_intent")
        if intent.status != IntentStatus.SUCCEEDED:
            raise InvalidState(
                "payment_intent_unexpected_state",
                f"Only a succeeded PaymentIntent can be refunded; this one is {intent.status}.",
                param="payment_intent",
            )
        if amount is not None:
            money.refuse_out_of_bounds(amount, intent.currency)
        if intent.amount_received == 0 and intent.capture_method == CaptureMethod.AUTOMATIC:
            # Settled by a worker of the release before manual capture, during a rolling
            # deploy, after the migration's backfill: an automatic charge received it all.
            refund_repository.repair_amount_received(intent.id)
            intent.amount_received = intent.amount
        # Current: every change of amount_refunded holds the lock taken above. Bounded by what
        # was captured (a partial capture's less than the amount).
        left = intent.amount_received - intent.amount_refunded
        if left <= 0:
            raise InvalidInput(
                "charge_already_refunded", "This PaymentIntent has already been refunded in full.", param="amount"
            )
        if amount is None:
            amount = left
        if amount > left:
            raise InvalidInput(
                "amount_too_large",
                f"Refund amount ({money.format_amount(amount, intent.currency)}) is greater than what is left"
                f" to refund ({money.format_amount(left, intent.currency)}).",
                param="amount",
            )
        if get_rail(intent.rail) is None:
            raise InvalidState("rail_unknown", f"The rail {intent.rail!r} is no longer configured.")
        charge = Charge.objects.get(intent=intent, status=ChargeStatus.SUCCEEDED)
        refund = Refund.objects.create(
            merchant=merchant,
            intent=intent,
            charge=charge,
            rail=intent.rail,
            amount=amount,
            currency=intent.currency,
            reason=reason or None,
        )
        refund.refresh_from_db()
        emit(merchant, EventType.REFUND_CREATED, render_refund(refund))
        refund_repository.set_amount_refunded(intent.id, intent.amount_refunded + amount)
        queue.enqueue(
            JobKind.POLL_REFUND,
            {"refund_id": refund.id},
            dedupe_key=refund_repository.poll_dedupe_key(refund.id),
            tenant=merchant.id,
        )
    logger.info("refund accepted", extra={"refund_id": refund.id, "intent_id": intent.id, "amount": amount})
    return refund


def _emit(refund_id: str, *event_types: EventType) -> None:
    refund = Refund.objects.select_related("charge").get(pk=refund_id)
    for event_type in event_types:
        if event_type == EventType.CHARGE_REFUNDED:
            emit(refund.merchant_id, event_type, render_charge(refund.charge, for_event=True))
        else:
            emit(refund.merchant_id, event_type, render_refund(refund))


def refund_succeed(*, row: RefundRow) -> bool:
    """The rail returned the money: ``succeeded`` with ``refund.succeeded``, ``refund.updated``
    and ``charge.refunded``, once."""
    with transaction.atomic():
        if not refund_repository.settle(row.id, RefundStatus.SUCCEEDED):
            return False  # a concurrent poll settled it, and emitted the event
        _emit(row.id, EventType.REFUND_SUCCEEDED, EventType.REFUND_UPDATED, EventType.CHARGE_REFUNDED)
    REFUNDS_SETTLED.labels(rail=row.rail, outcome="succeeded").inc()
    logger.info("refund succeeded", extra={"refund_id": row.id, "intent_id": row.intent_id})
    return True


def refund_fail(*, row: RefundRow, failure_code: str | None) -> bool:
    """The rail refused it for good: ``failed`` with ``refund.failed`` and ``refund.updated``, and its amount is
    given back to the intent (it may be refunded again), in one transaction."""
    with transaction.atomic():
        if not refund_repository.settle(row.id, RefundStatus.FAILED, failure_code or "declined"):
            return False
        refund_repository.give_back(row.intent_id, row.amount)
        _emit(row.id, EventType.REFUND_FAILED, EventType.REFUND_UPDATED)
    REFUNDS_SETTLED.labels(rail=row.rail, outcome="failed").inc()
    logger.info("refund failed", extra={"refund_id": row.id, "failure_code": failure_code})
    return True


def refund_escalate(*, row: RefundRow, reason: str, alert_period: float) -> bool:
    """Past the horizon with no terminal answer: ``unresolved`` once, and an alert once per
    ``alert_period`` of the refund's age (the key carries the period's index, as a charge's
    does). The money stays counted in ``amount_refunded``: it may have moved. A late answer
    still settles it."""
    period = int(row.age // alert_period) if alert_period > 0 else 0
    with transaction.atomic():
        moved = refund_repository.escalate(row.id)
        if moved:
            _emit(row.id, EventType.REFUND_UPDATED)
        raise_alert(
            key=f"refund_unresolved:{row.id}:{period}",
            title=f"Refund {row.id} on rail {row.rail} is unresolved after {row.age / 3600:.1f} h",
            source="charges.refund_unresolved",
            severity=Severity.ERROR,
            details={
                "refund_id": row.id,
                "intent_id": row.intent_id,
                "charge_id": row.charge_id,
                "rail": row.rail,
                "amount": row.amount,
                "age_seconds": round(row.age),
                "first": moved,
                "reason": reason[:300],
            },
            link=admin_path(Refund.objects.get(pk=row.id)),
            correlation_id=row.id,
        )
    if moved:
        REFUNDS_UNRESOLVED.labels(rail=row.rail).inc()
    logger.warning(
        "refund unresolved past the horizon" if moved else "refund still unresolved",
        extra={"refund_id": row.id, "rail": row.rail, "age_seconds": round(row.age), "reason": reason[:300]},
    )
    return moved
