"""Writing events (the outbox) and rendering them on the wire."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from django.db import DatabaseError, connection, transaction

from merchants.models import Merchant
from vpay import api_version
from vpay.livemode import with_livemode
from vpay.prepared import execute_prepared_row
from webhooks.event_types import EventType
from webhooks.models import Event, new_event_id

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
    event_id, data = new_event_id(), with_livemode(obj)
    # A hand-written, prepared INSERT (vpay.prepared): every settlement and every API write
    # emits, and the ORM's insert compile cost the worker more CPU than the statement costs
    # the database. Served by the primary key (the row also enters events_pending_fan_out).
    created_at, fan_out = execute_prepared_row(
        "INSERT INTO events (id, merchant_id, type, data, api_version)"
        " VALUES (%s::text, %s::text, %s::text, %s::jsonb, %s::text)"
        " RETURNING to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), fan_out",
        [event_id, merchant_id, event_type.value, json.dumps(data), api_version.CURRENT],
    )
    # The instance as the ORM's create() would leave it, the database's defaults read back.
    event = Event.from_db(
        connection.alias,
        [
            "id",
            "merchant_id",
            "type",
            "data",
            "api_version",
            "created_at",
            "fan_out",
            "fan_out_failures",
            "fan_out_transient_failures",
            "fan_out_redrives",
        ],
        [
            event_id,
            merchant_id,
            event_type.value,
            data,
            api_version.CURRENT,
            datetime.fromisoformat(created_at).replace(tzinfo=UTC),
            fan_out,
            0,
            0,
            0,
        ],
    )
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
    # Entries are (savepoint ids, callback, robust); the stubs still declare Django's old pairs.
    if not any(entry[1] is _wake_fan_out for entry in connection.run_on_commit):
        transaction.on_commit(_wake_fan_out)


def render_event(event: Event) -> dict:
    """The wire form of an event: the webhook body and the ``/v1/events`` answer.

    The event's ``livemode`` is its object's, as stored when it was written; an event
    written before objects carried it renders as it always did (its signed body must not
    change between delivery attempts). Its ``api_version`` likewise: the version its object
    was rendered in when it was written, absent on an event written before events carried it.
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
    if event.api_version is not None:
        rendered["api_version"] = event.api_version
    return rendered
