"""How a charge's capture phase ends, each one transaction with the event (or the alert) that
reports it. Each returns whether the charge moved; False means a concurrent run got there
first and reported it."""

from __future__ import annotations

import logging

from django.db import transaction

from charges import capture_repository, settlement_writes
from charges.capture_repository import PhaseRow
from charges.metrics import CHARGES_SETTLED
from charges.models import Charge
from charges.repository import ChargeRow
from charges.services.transitions import intent_for_event
from charges.states import ChargeStatus, IntentStatus
from charges.wire import render_charge, render_intent, render_session
from jobs.operator.alerts import Severity, admin_path, raise_alert
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)


def captured(row: ChargeRow, amount: int) -> bool:
    """The rail captured ``amount``: charge ``succeeded`` (``amount_captured``), intent
    ``succeeded`` (``amount_received``, what refunds are bounded by); ``charge.captured``,
    ``payment_intent.succeeded``; the checkout session is paid."""
    with transaction.atomic():
        settled = settlement_writes.settle_charge_and_intent(
            row.id,
            ChargeStatus.SUCCEEDED,
            IntentStatus.SUCCEEDED,
            settleable=[ChargeStatus.CAPTURING],
            open_intent=[IntentStatus.PROCESSING],
            amount_captured=amount,
        )
        if settled is None:
            return False
        intent, session = settled
        emit(intent.merchant_id, EventType.CHARGE_CAPTURED, render_charge(intent.charge, for_event=True))
        emit(intent.merchant_id, EventType.PAYMENT_INTENT_SUCCEEDED, render_intent(intent, for_event=True))
        if session is not None:
            session = settlement_writes.complete_session(row.intent_id)
            if session is not None:
                emit(intent.merchant_id, EventType.CHECKOUT_SESSION_COMPLETED, render_session(session, for_event=True))
    CHARGES_SETTLED.labels(rail=row.rail, outcome="captured").inc()
    logger.info("charge captured", extra={"charge_id": row.id, "intent_id": row.intent_id, "amount": amount})
    return True


def refused(row: ChargeRow, reason: str, *, attempt: int = 0) -> bool:
    """The rail refused the capture for good and still holds the authorization: charge back to
    ``authorized``, intent to ``requires_capture`` (``payment_intent.amount_capturable_updated``),
    and an alert (one per capture asked for: ``attempt``): the merchant may capture again, or
    cancel."""
    with transaction.atomic():
        if not capture_repository.capture_refused(row.id):
            return False
        capture_repository.reopen_intent_for_capture(row.intent_id)
        intent = intent_for_event(row.intent_id)
        emit(
            intent.merchant_id,
            EventType.PAYMENT_INTENT_AMOUNT_CAPTURABLE_UPDATED,
            render_intent(intent, for_event=True),
        )
        _alert(
            row, "capture_refused", f"Rail {row.rail} refused the capture of charge {row.id}", reason, period=attempt
        )
    logger.warning("rail refused a capture", extra={"charge_id": row.id, "reason": reason[:300]})
    return True


def lapsed(row: ChargeRow, answer: str) -> bool:
    """A capture found the authorization gone (the rail answered it ``canceled`` or
    ``failed``: expired or released at the rail): charge ``voided``, intent ``canceled``
    (``expired``) with ``payment_intent.canceled``, and an alert: nothing was captured."""
    with transaction.atomic():
        if not capture_repository.end_voided(row.id, [ChargeStatus.CAPTURING], "authorization_" + answer):
            return False
        capture_repository.lapse_intent(row.intent_id)
        intent = intent_for_event(row.intent_id)
        emit(intent.merchant_id, EventType.PAYMENT_INTENT_CANCELED, render_intent(intent, for_event=True))
        _alert(
            row,
            "capture_lapsed",
            f"Charge {row.id} could not be captured: the rail answered {answer}",
            "the authorization expired or was released at the rail; nothing was captured",
        )
    CHARGES_SETTLED.labels(rail=row.rail, outcome="voided").inc()
    return True


def voided(row: ChargeRow) -> bool:
    """The rail released the hold (or holds nothing): charge ``voided``. The intent was
    canceled, with its event, when the void was asked for."""
    with transaction.atomic():
        if not capture_repository.end_voided(row.id, [ChargeStatus.VOIDING]):
            return False
    CHARGES_SETTLED.labels(rail=row.rail, outcome="voided").inc()
    logger.info("charge voided", extra={"charge_id": row.id, "intent_id": row.intent_id})
    return True


def late_success(row: ChargeRow, amount: int, *, sources=(ChargeStatus.VOIDING,)) -> bool:
    """A void answered that the money had already moved: the charge is recorded ``succeeded``
    with what was captured, never lost, and an operator is paged to refund or reconcile it
    (its intent stays canceled or failed: the merchant was told so)."""
    with transaction.atomic():
        if not capture_repository.late_success(row.id, amount, sources):
            return False
        _alert(
            row,
            "late_success",
            f"Charge {row.id} succeeded at rail {row.rail} after vpay voided or failed it",
            "the rail reports the money captured; refund the payer or reconcile with the merchant",
            severity=Severity.PAGE,
        )
    CHARGES_SETTLED.labels(rail=row.rail, outcome="late_success").inc()
    logger.error("charge succeeded at the rail after it was voided", extra={"charge_id": row.id, "amount": amount})
    return True


def void_refused(row: ChargeRow, phase: PhaseRow) -> None:
    """The rail refused the void for good and still reports the authorization: the hold stands
    and no retry can release it. The charge stays ``voiding`` (its intent was canceled and
    told so) and an operator is alerted to release it at the rail; the poll asks hourly."""
    with transaction.atomic():
        _alert(
            row,
            "void_refused",
            f"Rail {row.rail} refused the void of charge {row.id}; the authorization still holds the payer's money",
            "release the authorization at the rail; the charge's poll records the rail's word when it changes",
        )
    logger.warning("rail refused a void", extra={"charge_id": row.id, "age_seconds": round(phase.age)})


def escalate(row: ChargeRow, phase: PhaseRow, reason: str, *, alert_period: float) -> None:
    """Past the operation's horizon without a final answer: an alert once per ``alert_period``
    of its age (the key carries the period's index, as an unresolved charge's does). The
    charge stays capturing (voiding) and its poll keeps asking hourly."""
    period = int(phase.age // alert_period) if alert_period > 0 else 0
    operation = "capture" if phase.status == ChargeStatus.CAPTURING else "void"
    with transaction.atomic():
        _alert(
            row,
            f"{operation}_unresolved",
            f"The {operation} of charge {row.id} on rail {row.rail} is unresolved after {phase.age / 3600:.1f} h",
            reason,
            period=period,
        )


def _alert(
    row: ChargeRow, kind: str, title: str, reason: str, *, severity: Severity = Severity.ERROR, period: int = 0
) -> None:
    raise_alert(
        key=f"charge_{kind}:{row.id}:{period}",
        title=title,
        source=f"charges.{kind}",
        severity=severity,
        details={"charge_id": row.id, "intent_id": row.intent_id, "rail": row.rail, "reason": reason[:300]},
        link=admin_path(Charge.objects.get(pk=row.id)),
        correlation_id=row.id,
    )
