"""The wire form of a webhook delivery and its attempts (``GET
/v1/webhook_endpoints/{id}/deliveries``): what was sent to the merchant's endpoint and what
it answered. Never the signing secret or the signature: neither is stored with an attempt."""

from __future__ import annotations

import re
from datetime import datetime

from django.db.models import F, Prefetch, QuerySet

from webhooks.models import DELIVERY_WIRE_PREFIX, DeliveryAttempt, DeliveryState, WebhookDelivery

# ``public_id``: random, made by the database (webhooks.models.RANDOM_DELIVERY_ID). The
# primary key never reaches the wire.
_WIRE_ID = re.compile(DELIVERY_WIRE_PREFIX + r"[0-9a-f]{32}")
# The latest attempts shown per delivery (its ``attempt_count`` says how many there were):
# merchant retries add a ladder each, and a page must stay bounded.
ATTEMPTS_SHOWN = 20
# Of the receiver's answer body (stored bounded to 4 KiB): enough to read its error.
EXCERPT_SHOWN = 1000


def delivery_lookup(wire_id: str) -> dict | None:
    """The lookup that finds the delivery a wire id names (by ``webhook_deliveries_public_id``),
    or None when the text cannot name one (answered as a 404 without a query)."""
    return {"public_id": wire_id} if _WIRE_ID.fullmatch(wire_id) else None


def deliveries_for_wire(queryset: QuerySet) -> QuerySet:
    """``queryset`` with what :func:`render_delivery` reads: the event's type (not its
    body) and the latest attempts, in two queries for a whole page (the attempts by the
    ``webhook_attempts_delivery_number`` unique index)."""
    latest = DeliveryAttempt.objects.filter(number__gt=F("delivery__attempts") - ATTEMPTS_SHOWN).order_by("number")
    return queryset.annotate(event_type=F("event__type")).prefetch_related(
        Prefetch("attempt_rows", queryset=latest, to_attr="latest_attempts")
    )


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_attempt(attempt: DeliveryAttempt) -> dict:
    return {
        "number": attempt.number,
        "state": attempt.state,
        "status_code": attempt.status_code,
        "started": _unix(attempt.started_at),
        "finished": _unix(attempt.finished_at),
        "duration_ms": attempt.duration_ms,
        "response_excerpt": _bounded(attempt.response_excerpt, EXCERPT_SHOWN),
        "error": attempt.error or None,
    }


def render_delivery(delivery: WebhookDelivery) -> dict:
    """A delivery read through :func:`deliveries_for_wire`."""
    pending = delivery.state == DeliveryState.PENDING
    return {
        "id": delivery.public_id,
        "object": "webhook_delivery",
        "webhook_endpoint": delivery.endpoint_id,
        "event": delivery.event_id,
        "event_type": delivery.event_type,  # type: ignore[attr-defined]  # annotated by deliveries_for_wire()
        "state": delivery.state,
        "created": _unix(delivery.created_at),
        "next_attempt": _unix(delivery.next_attempt_at) if pending else None,
        "completed": _unix(delivery.completed_at),
        "last_status_code": delivery.last_status_code,
        "cancel_reason": delivery.cancel_reason or None,
        "attempt_count": delivery.attempts,
        "attempts": [render_attempt(attempt) for attempt in delivery.latest_attempts],  # type: ignore[attr-defined]  # prefetched by deliveries_for_wire()
    }
