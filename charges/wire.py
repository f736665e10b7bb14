"""The wire forms of intents, charges, refunds and checkout sessions (API answers and event bodies).

An event body is a copy that outlives the moment and travels to merchant endpoints, so the
event renders leave out what only the payer's own browser should hold: the redirect URL
(it carries the rail's ``pay_token``) and the session's client secret.
"""

from __future__ import annotations

from django.conf import settings

from charges.models import Charge, CheckoutSession, PaymentIntent, Refund
from charges.states import ChargeStatus, IntentStatus


def _ts(value) -> int | None:
    return int(value.timestamp()) if value is not None else None


def render_charge(charge: Charge, *, for_event: bool = False) -> dict:
    return {
        "id": charge.id,
        "object": "charge",
        "payment_intent": charge.intent_id,
        "amount": charge.amount,
        "currency": charge.currency,
        "rail": charge.rail,
        "flow": charge.flow,
        "status": charge.status,
        "captured": charge.status == ChargeStatus.SUCCEEDED,
        "amount_captured": charge.amount_captured or 0,
        "failure_code": charge.failure_code,
        "redirect_url": None if for_event else charge.redirect_url,
        "created": _ts(charge.created_at),
    }


def _charge_of(intent: PaymentIntent) -> Charge | None:
    try:
        return intent.charge
    except Charge.DoesNotExist:
        return None


def render_intent(intent: PaymentIntent, *, for_event: bool = False) -> dict:
    return _render_intent(intent, _charge_of(intent), for_event=for_event)


def render_new_intent(intent: PaymentIntent, *, for_event: bool = False) -> dict:
    """:func:`render_intent` of an intent created in this transaction: it has no charge, so
    none is looked up (the reverse one-to-one's query was an eighth of the web process's CPU
    under load)."""
    return _render_intent(intent, None, for_event=for_event)


def _render_intent(intent: PaymentIntent, charge: Charge | None, *, for_event: bool) -> dict:
    redirect_url = charge.redirect_url if charge is not None and not for_event else None
    next_action = None
    if intent.status == IntentStatus.REQUIRES_ACTION and redirect_url:
        next_action = {"type": "redirect_to_url", "redirect_url": redirect_url}
    return {
        "id": intent.id,
        "object": "payment_intent",
        "amount": intent.amount,
        "currency": intent.currency,
        "rail": intent.rail,
        "status": intent.status,
        "customer": intent.customer_id,
        "metadata": intent.metadata,
        "capture_method": intent.capture_method,
        "amount_capturable": intent.amount_capturable,
        "amount_received": intent.amount_received,
        "amount_refunded": intent.amount_refunded,
        "canceled_at": _ts(intent.canceled_at),
        "cancellation_reason": intent.cancellation_reason,
        "charge": render_charge(charge, for_event=for_event) if charge is not None else None,
        "redirect_url": redirect_url,
        "next_action": next_action,
        "last_payment_error": (
            {"code": charge.failure_code} if charge is not None and intent.status == IntentStatus.FAILED else None
        ),
        "created": _ts(intent.created_at),
    }


def render_refund(refund: Refund) -> dict:
    """The same for the API and events: a refund carries nothing of the payer's credentials."""
    return {
        "id": refund.id,
        "object": "refund",
        "payment_intent": refund.intent_id,
        "charge": refund.charge_id,
        "amount": refund.amount,
        "currency": refund.currency,
        "reason": refund.reason,
        "status": refund.status,
        "failure_code": refund.failure_code,
        "created": _ts(refund.created_at),
    }


def session_url(session: CheckoutSession) -> str:
    return settings.VPAY_CHECKOUT_BASE_URL + session.id


def render_session(session: CheckoutSession, *, for_event: bool = False) -> dict:
    intent = session.intent
    return {
        "id": session.id,
        "object": "checkout.session",
        "status": session.status,
        "payment_status": session.payment_status,
        "payment_intent": intent.id,
        "amount": intent.amount,
        "currency": intent.currency,
        "rail": intent.rail,
        "customer": intent.customer_id,
        "metadata": intent.metadata,
        "url": None if for_event else session_url(session),
        "client_secret": None if for_event else session.client_secret,
        "success_url": session.success_url or None,
        "cancel_url": session.cancel_url or None,
        "expires_at": _ts(session.expires_at),
        "created": _ts(session.created_at),
    }
