"""Writing events (the outbox) and rendering them on the wire."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection, transaction

from merchants.models import Merchant
from vpay.livemode import with_livemode
from webhooks.event_types import EventType
from webhooks.models import Event

logger = logging.getLogger(__name__)


def emit(merchant: Merchant | str, type: EventType | str, obj: dict) -> Event:
    """Write an event about ``obj`` (a rendered wire object with ``id`` and ``object``) in
    the caller's transaction; ``merchant`` is a merchant or its id. It is the only way events are written.

    Refuses to run outside a transaction: an event committed apart from the change it
    reports is either a webhook about something that did not happen or a change no
    merchant hears about.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("emit() must run inside the transaction that makes the change it reports")
    event_type = EventType(type)
    if not isinstance(obj, dict) or "id" not in obj or "object" not in obj:
        raise ValueError("an event's object is a rendered wire object with 'id' and 'object'")
    merchant_id = merchant if isinstance(merchant, str) else merchant.pk
    event = Event.objects.create(merchant_id=merchant_id, type=event_type, data=with_livemode(obj))
    wake_fan_out_at_commit()
    return event


def _wake_fan_out() -> None:
    """Make the outbox drain due now (it otherwise waits its idle period)."""
    from jobs.kinds import JobKind
    from jobs.port import pull_forward
    from jobs.registry import Singleton

    try:
        pull_forward(Singleton().dedupe_key(JobKind.WEBHOOK_FAN_OUT.value))
    except DatabaseError:
        # Only latency is at stake: the drain runs on its own period anyway.
        logger.warning("could not wake the fan-out drain; it runs on its period", exc_info=True)


def wake_fan_out_at_commit() -> None:
    """Once per transaction, after it commits: a thousand events in one transaction wake
    the drain once, and an event that rolled back wakes nothing."""
    if not any(callback is _wake_fan_out for _, callback, _ in connection.run_on_commit):
        transaction.on_commit(_wake_fan_out)


def render_event(event: Event) -> dict:
    """The wire form of an event: the webhook body and the ``/v1/events`` answer.

    The event's ``livemode`` is its object's, as stored when it was written; an event
    written before objects carried it renders as it always did (its signed body must not
    change between delivery attempts).
    """
    rendered = {
        "id": event.id,
        "object": "event",
        "type": event.type,
        "created": int(event.created_at.timestamp()),
        "data": {"object": event.data},
    }
    if isinstance(event.data, dict) and "livemode" in event.data:
        rendered["livemode"] = event.data["livemode"]
    return rendered
