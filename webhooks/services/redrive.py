"""Re-driving abandoned events (the ops console's "re-drive" action).

An event is ``abandoned`` after its fan-out failed on every allowed pass; once an operator
has fixed the cause, the event goes back to ``pending`` with its failure count reset, and
the drain is woken when that commits. Its deliveries are then created as for any event
(the unique ``(event, endpoint)`` index absorbs any that a failed pass left behind).
"""

from __future__ import annotations

import logging

from django.db import transaction

from vpay.admin_log import log_change
from webhooks import repository
from webhooks.events import wake_fan_out_at_commit
from webhooks.models import Event

logger = logging.getLogger("webhooks.redrive")


def redrive_event(event_id: str, *, actor=None, reason: str = "") -> bool:
    """CAS ``abandoned → pending`` (failures reset); False if the event was not abandoned.
    ``reason`` (the operator's why) is recorded on the event's History with the actor."""
    with transaction.atomic():
        if not repository.redrive_event(event_id):
            return False
        message = "Re-driven: fan-out failures reset, back to pending" + (f". Reason: {reason}" if reason else ".")
        log_change(actor, Event, event_id, f"event {event_id}", message)
        wake_fan_out_at_commit()
    logger.info("abandoned event re-driven", extra={"event_id": event_id, "actor": str(actor or ""), "reason": reason})
    return True
