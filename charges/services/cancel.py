"""Canceling a payment intent (web process, one transaction).

Two states can be canceled. ``requires_confirmation``: nothing was sent to a rail.
``requires_capture`` (manual capture): the rail holds an authorization nothing has
captured; the charge goes ``voiding`` and its poll sends the void (the hold is released at
the rail; ``charges.services.capture_polling``). In between, a charge exists at (or is on
its way to) the rail, where the payer may approve it; canceling our record would not stop
the money, so the answer says so and the merchant waits for the charge to settle (and
refunds it if it succeeded).

The cancel locks the intent row as the confirm does, and both write through the same
guarded ``requires_confirmation → …`` compare-and-swap: racing, exactly one wins, and the
other is refused. The intent's open checkout session expires in the same transaction, with
its event, so a payer can no longer pay a session whose intent the merchant saw canceled.
"""

from __future__ import annotations

import logging

from django.db import transaction

from charges import capture_repository, guarded, repository
from charges.models import PaymentIntent
from charges.services.capture import wake_poll
from charges.services.checkout_expiry import expire_session_of_canceled_intent
from charges.states import CancellationReason, IntentStatus
from charges.wire import render_intent
from merchants.models import Merchant
from vpay.errors import InvalidState, NotFound
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)

# Why a cancel is refused, by the intent's state: the 409's message.
_REFUSED = {
    IntentStatus.PROCESSING: (
        "This PaymentIntent's charge is live at the rail (processing, or being captured): it can no longer be"
        " canceled. Wait for it to settle, and refund it if it succeeds."
    ),
    IntentStatus.REQUIRES_ACTION: (
        "This PaymentIntent's charge is live at the rail (requires_action: the payer holds a payment URL): "
        "it can no longer be canceled. Wait for it to settle, and refund it if it succeeds."
    ),
    IntentStatus.SUCCEEDED: "This PaymentIntent has succeeded; refund it instead.",
    IntentStatus.FAILED: "This PaymentIntent has failed; there is nothing to cancel.",
    IntentStatus.CANCELED: "This PaymentIntent is already canceled.",
}


def payment_intent_cancel(
    *, merchant: Merchant, payment_intent: str, cancellation_reason: CancellationReason | str | None = None
) -> PaymentIntent:
    """Cancel the merchant's intent; ``payment_intent.canceled`` and, if it had an open
    checkout session, ``checkout.session.expired``. Refuses with ``NotFound`` or
    ``InvalidState`` (``payment_intent_unexpected_state``, the message saying why)."""
    with transaction.atomic():
        intent = guarded.lock_intent(payment_intent, merchant_id=merchant.id)
        if intent is None:
            raise NotFound("resource_missing", f"No such payment_intent: {payment_intent!r}.", param="id")
        if intent.status == IntentStatus.REQUIRES_CAPTURE:
            _void_authorization(intent, cancellation_reason or None)
        elif intent.status != IntentStatus.REQUIRES_CONFIRMATION or not repository.cancel_intent(
            intent.id, cancellation_reason or None
        ):
            intent.refresh_from_db(fields=["status"])
            why = _REFUSED.get(IntentStatus(intent.status), "This PaymentIntent cannot be canceled now.")
            raise InvalidState("payment_intent_unexpected_state", why)
        expire_session_of_canceled_intent(intent.id)
        intent = PaymentIntent.objects.select_related("charge").get(pk=intent.id)
        emit(merchant, EventType.PAYMENT_INTENT_CANCELED, render_intent(intent, for_event=True))
    logger.info("payment intent canceled", extra={"intent_id": intent.id, "reason": cancellation_reason})
    return intent


def _void_authorization(intent: PaymentIntent, reason: str | None) -> None:
    """An authorized intent (its row locked by the caller): the charge ``authorized → voiding``,
    the intent ``canceled``, and the charge's poll woken to send the void. Under the lock the
    charge is authorized whenever the intent requires capture; if either guard ever missed,
    the refusal rolls the whole transaction back."""
    charge_id = intent.charge.id
    if not capture_repository.start_void(charge_id) or not capture_repository.cancel_authorized_intent(
        intent.id, reason
    ):
        raise InvalidState("payment_intent_unexpected_state", "This PaymentIntent cannot be canceled now.")
    wake_poll(charge_id, intent.merchant_id)
