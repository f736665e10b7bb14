"""Capturing an authorized payment intent (web process, one transaction).

The merchant's capture is accepted here and performed by the worker, as a refund is: under
the intent's row lock (the lock a cancel and the expiry sweep take too, so exactly one of
them moves an authorization), the charge goes ``authorized → capturing`` with the amount to
capture, the intent ``requires_capture → processing`` with ``payment_intent.processing``,
and the charge's poll is made due now. The poll sends the capture (its request row
committed first) and records the rail's word: ``charge.captured`` and
``payment_intent.succeeded`` (``charges.services.capture_polling``). No web request waits
on a rail, and a crash anywhere leaves a job that finds the charge.
"""

from __future__ import annotations

import logging

from django.db import transaction

from charges import capture_repository, guarded, money, repository
from charges.models import PaymentIntent
from charges.rails import get_rail
from charges.states import IntentStatus
from charges.wire import render_intent
from jobs import port as queue
from jobs.kinds import JobKind
from merchants.models import Merchant
from vpay.errors import InvalidInput, InvalidState, NotFound
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)

_REFUSED = {
    IntentStatus.REQUIRES_CONFIRMATION: "This PaymentIntent has not been confirmed; there is nothing to capture.",
    IntentStatus.PROCESSING: "This PaymentIntent is processing (a capture may be under way); wait for it to settle.",
    IntentStatus.REQUIRES_ACTION: "This PaymentIntent waits for the payer to approve; there is nothing to capture yet.",
    IntentStatus.SUCCEEDED: "This PaymentIntent has already been captured.",
    IntentStatus.FAILED: "This PaymentIntent has failed; there is nothing to capture.",
    IntentStatus.CANCELED: "This PaymentIntent was canceled; there is nothing to capture.",
}


def payment_intent_capture(
    *, merchant: Merchant, payment_intent: str, amount_to_capture: int | None = None
) -> PaymentIntent:
    """Capture ``amount_to_capture`` (default: all that is capturable) of an intent in
    ``requires_capture``; a partial capture releases the rest. Refuses, writing nothing:
    ``NotFound``, ``InvalidState`` (not ``requires_capture``; its rail is gone),
    ``InvalidInput`` (an amount outside the currency's bounds or above the capturable)."""
    with transaction.atomic():
        intent = guarded.lock_intent(payment_intent, merchant_id=merchant.id)
        if intent is None:
            raise NotFound("resource_missing", f"No such payment_intent: {payment_intent!r}.", param="id")
        if intent.status != IntentStatus.REQUIRES_CAPTURE:
            why = _REFUSED.get(IntentStatus(intent.status), "This PaymentIntent cannot be captured now.")
            raise InvalidState("payment_intent_unexpected_state", why)
        amount = intent.amount_capturable if amount_to_capture is None else amount_to_capture
        money.refuse_out_of_bounds(amount, intent.currency, param="amount_to_capture")
        if amount > intent.amount_capturable:
            raise InvalidInput(
                "amount_too_large",
                f"amount_to_capture ({money.format_amount(amount, intent.currency)}) is greater than the amount"
                f" capturable ({money.format_amount(intent.amount_capturable, intent.currency)}).",
                param="amount_to_capture",
            )
        if get_rail(intent.rail) is None:
            raise InvalidState("rail_unknown", f"The rail {intent.rail!r} is no longer configured.")
        # Both guarded: under this lock the charge is authorized whenever the intent requires
        # capture, so neither can miss; if one ever did, the transaction rolls back whole.
        if not capture_repository.start_capture(intent.charge.id, amount) or not repository.intent_to(
            intent.id, IntentStatus.PROCESSING, [IntentStatus.REQUIRES_CAPTURE]
        ):
            raise InvalidState("payment_intent_unexpected_state", "This PaymentIntent cannot be captured now.")
        wake_poll(intent.charge.id, intent.merchant_id)
        intent = PaymentIntent.objects.select_related("charge").get(pk=intent.id)
        emit(merchant, EventType.PAYMENT_INTENT_PROCESSING, render_intent(intent, for_event=True))
    logger.info("capture accepted", extra={"intent_id": intent.id, "amount": amount})
    return intent


def wake_poll(charge_id: str, merchant_id: str) -> None:
    """The authorized charge's poll, due now: it waits for the authorization's expiry, or was
    lost (an operator's cancel) and is enqueued again. In the caller's transaction, so the
    job is due exactly when the operation it performs is committed."""
    # Waiting (parked until the authorization's expiry): due now. Running: woken, so it runs
    # again once it settles. Gone: enqueued again.
    queue.enqueue_or_wake(
        JobKind.POLL_CHARGE,
        {"charge_id": charge_id},
        dedupe_key=repository.poll_dedupe_key(charge_id),
        tenant=merchant_id,
    )
