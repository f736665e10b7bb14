"""The charge transitions that merchants hear about, each one transaction: the guarded
status writes and the event that reports them commit together or not at all.

Each returns whether the charge moved. A False is not an error: a concurrent worker (or
the confirm) got there first, and the event was written by whoever did.

The ones a poll's answer leads to (succeed, authorize, fail, escalate) open their block
with ``savepoint=False``: a poll runs them inside the transaction that records the answer
(``status_answers``), where a savepoint would cost two round trips per charge (the two were
18 % of the worker's sampled time over a settlement backlog) to undo what that transaction undoes
anyway, since any error inside it rolls it back whole. On their own, the block is the
transaction, and the flag changes nothing. So a caller that runs one inside its own
transaction must let an error out of it, never catch it and carry on: the transaction is
doomed (Django refuses any further statement in it).
"""

from __future__ import annotations

import logging

from django.db import transaction

from charges import repository, settlement_writes
from charges.metrics import CHARGES_SETTLED, CHARGES_UNRESOLVED
from charges.models import Charge, PaymentIntent, ProviderRequest, RequestOperation
from charges.repository import ChargeRow
from charges.states import ChargeStatus, IntentStatus
from charges.wire import render_charge, render_intent, render_session
from jobs import port as queue
from jobs.kinds import JobKind
from jobs.operator.alerts import Severity, admin_path, raise_alert
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)

_OPEN_INTENT = [IntentStatus.PROCESSING, IntentStatus.REQUIRES_ACTION]
# Failure codes vpay itself gives a charge (a rail's own come from its answer).
DEAD_ORDER = "redirect_never_delivered"
SUBMIT_REJECTED = "rail_rejected"
RAIL_CONFIGURATION = "rail_configuration_error"


def intent_for_event(intent_id: str) -> PaymentIntent:
    """The intent as the event reports it, after the writes, its charge attached."""
    return repository.for_event(intent_id)[0]


def succeed(row: ChargeRow) -> bool:
    """The rail says the money moved: charge and intent ``succeeded``, ``payment_intent.succeeded``,
    and the intent's checkout session (if any) ``complete`` with ``checkout.session.completed``."""
    with transaction.atomic(savepoint=False):
        if row.status == ChargeStatus.SUBMITTING:
            # A charge whose submit answer was lost: the rail answering about it is the
            # evidence it was submitted, so it passes through submitted (docs/architecture.md §8).
            repository.mark_submitted(row.id, pay_token=None, redirect_url=None)
        settled = settlement_writes.settle_charge_and_intent(row.id, ChargeStatus.SUCCEEDED, IntentStatus.SUCCEEDED)
        if settled is None:
            return False
        intent, session = settled
        emit(intent.merchant_id, EventType.PAYMENT_INTENT_SUCCEEDED, render_intent(intent, for_event=True))
        if session is not None:
            session = settlement_writes.complete_session(row.intent_id)
            if session is not None:
                emit(intent.merchant_id, EventType.CHECKOUT_SESSION_COMPLETED, render_session(session, for_event=True))
    CHARGES_SETTLED.labels(rail=row.rail, outcome="succeeded").inc()
    logger.info("charge succeeded", extra={"charge_id": row.id, "intent_id": row.intent_id})
    return True


def authorize(row: ChargeRow) -> bool:
    """Manual capture: the rail holds the money. Charge ``authorized`` (its expiry counts from
    now, on the database clock), intent ``requires_capture`` holding the amount as capturable,
    ``payment_intent.amount_capturable_updated``; the intent's open checkout session is
    complete (the payer's part is done) and stays unpaid until the capture."""
    with transaction.atomic(savepoint=False):
        if row.status == ChargeStatus.SUBMITTING:
            repository.mark_submitted(row.id, pay_token=None, redirect_url=None)
        if not repository.authorize_charge(row.id):
            return False
        repository.intent_to(row.intent_id, IntentStatus.REQUIRES_CAPTURE, _OPEN_INTENT, amount_capturable=row.amount)
        intent, session = repository.for_event(row.intent_id)
        emit(
            intent.merchant_id,
            EventType.PAYMENT_INTENT_AMOUNT_CAPTURABLE_UPDATED,
            render_intent(intent, for_event=True),
        )
        if session is not None:
            session = settlement_writes.complete_session(row.intent_id, paid=False)
            if session is not None:
                emit(intent.merchant_id, EventType.CHECKOUT_SESSION_COMPLETED, render_session(session, for_event=True))
    CHARGES_SETTLED.labels(rail=row.rail, outcome="authorized").inc()
    logger.info("charge authorized", extra={"charge_id": row.id, "intent_id": row.intent_id})
    return True


def fail(row: ChargeRow, failure_code: str | None) -> bool:
    """The rail says the charge failed: charge and intent ``failed``, ``payment_intent.payment_failed``."""
    with transaction.atomic(savepoint=False):
        if row.status == ChargeStatus.SUBMITTING:
            repository.mark_submitted(row.id, pay_token=None, redirect_url=None)
        settled = settlement_writes.settle_charge_and_intent(
            row.id, ChargeStatus.FAILED, IntentStatus.FAILED, failure_code or "declined"
        )
        if settled is None:
            return False
        _emit_failed(settled[0])
    CHARGES_SETTLED.labels(rail=row.rail, outcome="failed").inc()
    logger.info("charge failed", extra={"charge_id": row.id, "failure_code": failure_code})
    return True


def fail_submitting(charge_id: str, intent_id: str, failure_code: str, *, rail: str) -> bool:
    """``submitting → failed``: a redirect order nobody was handed a URL for (past the window),
    or a submit the rail refused for good; either is then voided at the rail
    (``charges.services.void_failed``)."""
    with transaction.atomic():
        if not repository.fail_submitting(charge_id, failure_code):
            return False
        _fail_intent(intent_id)
        if failure_code in VOIDED_AFTER and _submit_went_out(charge_id):
            # The rail may hold it (a lost answer, a refusal that kept the reference): void
            # it there, in this transaction, so no payer can pay what vpay has failed.
            enqueue_void(charge_id, Charge.objects.filter(pk=charge_id).values_list("merchant_id", flat=True).first())
    CHARGES_SETTLED.labels(rail=rail, outcome="failed").inc()
    logger.info("charge failed while submitting", extra={"charge_id": charge_id, "failure_code": failure_code})
    return True


# The failure codes a charge gets from vpay, not from its rail, that a rail may still hold.
VOIDED_AFTER = frozenset({DEAD_ORDER, SUBMIT_REJECTED})


def _submit_went_out(charge_id: str) -> bool:
    """Whether a submit of the charge was ever sent (a crash before the confirm's POST leaves
    none: the rail never heard of it, and there is nothing to void)."""
    return ProviderRequest.objects.filter(charge_id=charge_id, operation=RequestOperation.SUBMIT).exists()


def void_dedupe_key(charge_id: str) -> str:
    return f"charge:void:{charge_id}"


def enqueue_void(charge_id: str, merchant_id: str | None) -> None:
    """The charge's ``void_charge`` job (charges/services/void_failed.py), in the transaction
    that failed it: the void exists iff the failure does."""
    queue.enqueue(
        JobKind.VOID_CHARGE, {"charge_id": charge_id}, dedupe_key=void_dedupe_key(charge_id), tenant=merchant_id
    )


def _fail_intent(intent_id: str) -> None:
    repository.intent_to(intent_id, IntentStatus.FAILED, _OPEN_INTENT)
    _emit_failed(intent_for_event(intent_id))


def _emit_failed(intent: PaymentIntent) -> None:
    emit(intent.merchant_id, EventType.PAYMENT_INTENT_PAYMENT_FAILED, render_intent(intent, for_event=True))


def escalate_to_unresolved(row: ChargeRow, reason: str, *, alert_period: float) -> bool:
    """Past the horizon with no terminal answer: ``unresolved`` and ``charge.unresolved``, once,
    and an intent in ``requires_action`` back to ``processing``.

    Idempotent: on a charge already ``unresolved`` the guarded write matches nothing and
    nothing is written (``updated_at`` keeps naming the last real change), but the alert
    is raised again, once per ``alert_period`` of the charge's age (hourly): the key
    carries the period's index, so the hourly poll re-alerts and a burst of callbacks
    pulling the poll forward within one hour does not. A human reconciles the charge
    against the rail's statement; the poll keeps asking, because a late success is the
    normal way an unresolved charge ends.
    """
    period = int(row.age // alert_period) if alert_period > 0 else 0
    with transaction.atomic(savepoint=False):
        moved = repository.escalate_charge(row.id)
        charge = Charge.objects.select_related("merchant").get(pk=row.id)
        if moved:
            # A redirect intent still asking the payer to act is sent nowhere any more:
            # past the horizon its charge is a human's, and the intent says processing
            # like every intent whose charge is unresolved (docs/architecture.md §8, docs/charges.md).
            repository.intent_to(row.intent_id, IntentStatus.PROCESSING, [IntentStatus.REQUIRES_ACTION])
            emit(charge.merchant, EventType.CHARGE_UNRESOLVED, render_charge(charge, for_event=True))
        raise_alert(
            key=f"charge_unresolved:{row.id}:{period}",
            title=f"Charge {row.id} on rail {row.rail} is unresolved after {row.age / 3600:.1f} h",
            source="charges.unresolved",
            severity=Severity.ERROR,
            details={
                "charge_id": row.id,
                "intent_id": row.intent_id,
                "rail": row.rail,
                "age_seconds": round(row.age),
                "first": moved,
                "reason": reason[:300],
            },
            link=admin_path(charge),
            correlation_id=row.id,
        )
    if moved:
        CHARGES_UNRESOLVED.labels(rail=row.rail).inc()
    logger.warning(
        "charge unresolved past the horizon" if moved else "charge still unresolved",
        extra={"charge_id": row.id, "rail": row.rail, "age_seconds": round(row.age), "reason": reason[:300]},
    )
    return moved
