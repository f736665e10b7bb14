"""Re-driving abandoned events (the ops console's "re-drive" action).

An event is ``abandoned`` after its fan-out failed on every allowed pass; once an operator
has fixed the cause, the event goes back to ``pending`` with its failure count reset, and
the drain is woken when that commits. Its deliveries are then created as for any event
(the unique ``(event, endpoint)`` index absorbs any that a failed pass left behind).
"""

from __future__ import annotations

import logging

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction

from webhooks import repository
from webhooks.events import wake_fan_out_at_commit
from webhooks.models import Event

logger = logging.getLogger("webhooks.redrive")


def redrive_event(event_id: str, *, actor=None) -> bool:
    """CAS ``abandoned → pending`` (failures reset); False if the event was not abandoned."""
    with transaction.atomic():
        if not repository.redrive_event(event_id):
            return False
        if actor is not None and getattr(actor, "pk", None) is not None:
            LogEntry.objects.create(
                user_id=actor.pk,
                content_type_id=ContentType.objects.get_for_model(Event).pk,
                object_id=event_id,
                object_repr=f"event {event_id}",
                action_flag=CHANGE,
                change_message="Re-driven: fan-out failures reset, back to pending.",
            )
        wake_fan_out_at_commit()
    logger.info("abandoned event re-driven", extra={"event_id": event_id, "actor": str(actor or "")})
    return True
