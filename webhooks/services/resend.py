"""Resending a delivery an operator chose (the ops console's "resend" action).

The delivery goes back to ``pending`` with a fresh ladder (``ladder_base`` = the attempts
made so far, so attempt numbers keep counting up while the rungs start over), due now, and
its deliver job is enqueued in the same transaction. The receiver gets the same event id
again, which is what at-least-once delivery already asks it to absorb.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

from jobs.kinds import JobKind
from jobs.queue import enqueue
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services.delivery import dedupe_key

logger = logging.getLogger("webhooks.resend")

TERMINAL = (DeliveryState.EXHAUSTED, DeliveryState.REFUSED)


def resend_delivery(delivery_id: int, *, actor=None, states: Iterable[str] = TERMINAL) -> bool:
    """CAS ``<one of states> → pending`` with a fresh ladder; False if it was in none of them."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE webhook_deliveries SET state = 'pending', ladder_base = attempts, next_attempt_at = now(),"
                " completed_at = NULL, updated_at = now() WHERE id = %s AND state = ANY(%s) RETURNING endpoint_id",
                [delivery_id, [str(s) for s in states]],
            )
            row = cursor.fetchone()
        if row is None:
            return False
        enqueue(
            JobKind.WEBHOOK_DELIVER, {"delivery_id": delivery_id}, dedupe_key=dedupe_key(delivery_id), tenant=row[0]
        )
        if actor is not None and getattr(actor, "pk", None) is not None:
            LogEntry.objects.create(
                user_id=actor.pk,
                content_type_id=ContentType.objects.get_for_model(WebhookDelivery).pk,
                object_id=str(delivery_id),
                object_repr=f"delivery {delivery_id}",
                action_flag=CHANGE,
                change_message="Resent (fresh retry ladder).",
            )
    logger.info("webhook delivery resent", extra={"delivery_id": delivery_id, "actor": str(actor or "")})
    return True
