"""What a merchant asks of one of its webhook endpoints beyond configuring it: a test event
sent to it, and a retry of one of its deliveries. Both ride the normal delivery machinery
(a delivery row, a deliver job, the signed request, attempts as evidence).

Both take the merchant's id and check ownership themselves: another merchant's endpoint or
delivery is a :class:`~vpay.errors.NotFound`, the same as one that does not exist.
"""

from __future__ import annotations

import logging

from django.db import transaction

from vpay.errors import InvalidState, NotFound
from webhooks.endpoint_wire import render_endpoint
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryState, WebhookDelivery, WebhookEndpoint
from webhooks.services.fanout import fan_out_event
from webhooks.services.resend import resend_delivery

logger = logging.getLogger("webhooks.merchant_actions")

# A merchant may send any finished delivery again: a failed one after fixing the receiver,
# a delivered one the receiver lost. Not a cancelled one: its endpoint was deleted.
RETRYABLE = (DeliveryState.EXHAUSTED, DeliveryState.REFUSED, DeliveryState.SUCCEEDED)
RETRY_REASON = "retried by the merchant"


def _live_endpoint(merchant_id: str, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id, merchant_id=merchant_id, deleted_at__isnull=True).first()
    if endpoint is None:
        raise NotFound("resource_missing", f"No such webhook_endpoint: {endpoint_id!r}.", param="id")
    return endpoint


def _refuse_disabled(endpoint: WebhookEndpoint) -> None:
    if endpoint.disabled_at is not None:
        raise InvalidState(
            "webhook_endpoint_disabled",
            f"Webhook endpoint {endpoint.pk} is disabled: nothing is sent to it."
            " Enable it first (POST /v1/webhook_endpoints/{id}/enable).",
            param="id",
        )


def webhook_endpoint_test(*, merchant_id: str, endpoint_id: str) -> int:
    """Send a ``webhook_endpoint.test`` event (its object: the endpoint) to this endpoint
    only, whatever it subscribes to; returns the id of the one delivery made.

    The event is written and fanned out in one transaction, by the drain's own
    ``fan_out_event`` (whose rule for this type makes exactly one delivery, to the endpoint
    the event is about), so the answer can name the delivery and the deliver job is
    enqueued with it. An endpoint disabled or deleted meanwhile gets no delivery: the
    whole transaction rolls back and the refusal is answered, nothing is left behind."""
    with transaction.atomic():
        endpoint = _live_endpoint(merchant_id, endpoint_id)
        _refuse_disabled(endpoint)
        event = emit(merchant_id, EventType.WEBHOOK_ENDPOINT_TEST, render_endpoint(endpoint))
        fan_out_event(event.pk)
        delivery_id = WebhookDelivery.objects.filter(event_id=event.pk).values_list("pk", flat=True).first()
        if delivery_id is None:  # disabled or deleted since it was read
            _refuse_disabled(_live_endpoint(merchant_id, endpoint_id))
            raise InvalidState("webhook_endpoint_changed", "The endpoint changed meanwhile; try again.", param="id")
    logger.info("test event sent", extra={"endpoint_id": endpoint_id, "event_id": event.pk, "delivery_id": delivery_id})
    return delivery_id


def webhook_delivery_retry(*, merchant_id: str, endpoint_id: str, public_id: str) -> int:
    """Send a finished delivery (``exhausted``, ``refused`` or ``succeeded``) again now with a
    fresh retry ladder, through the operators' resend (``resend_delivery``), whose
    compare-and-swap refuses a delivery that is pending or delivering, including one
    retried meanwhile by another request. ``public_id``: the delivery's wire id. Returns
    the delivery's primary key.

    A delivery of another endpoint (even the merchant's own) is a ``NotFound``: the path
    names both."""
    with transaction.atomic():
        endpoint = _live_endpoint(merchant_id, endpoint_id)
        found = WebhookDelivery.objects.filter(public_id=public_id, endpoint_id=endpoint.pk)
        delivery_id = found.values_list("pk", flat=True).first()
        if delivery_id is None:
            raise NotFound("resource_missing", f"No such webhook_delivery: {public_id!r}.", param="id")
        _refuse_disabled(endpoint)
        if not resend_delivery(delivery_id, states=RETRYABLE, reason=RETRY_REASON):
            # The CAS found it in no finished state: read what it is now, for the message.
            now = WebhookDelivery.objects.filter(pk=delivery_id).values_list("state", flat=True).first()
            raise _not_retryable(public_id, now)
    return delivery_id


def _not_retryable(wire_id: str, state: str | None) -> InvalidState:
    if state in (DeliveryState.PENDING, DeliveryState.DELIVERING):
        return InvalidState(
            "webhook_delivery_in_progress",
            f"Delivery {wire_id} is {state}: it is already being sent (or waits for its next attempt).",
            param="id",
        )
    return InvalidState(
        "webhook_delivery_not_retryable", f"Delivery {wire_id} is {state}: it cannot be sent again.", param="id"
    )
