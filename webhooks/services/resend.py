"""Resending a delivery an operator chose (the ops console's "resend" action).

The delivery goes back to ``pending`` with a fresh ladder (``ladder_base`` = the attempts
made so far, so attempt numbers keep counting up while the rungs start over), due now, and
its deliver job is enqueued in the same transaction (or, when the run that ended it has not
yet let go of its job, that job is woken to run again). The receiver gets the same event id
again, which is what at-least-once delivery already asks it to absorb.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction

from jobs.kinds import JobKind
from jobs.port import enqueue_or_wake
from vpay.admin_log import log_change
from webhooks import repository
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services.delivery import dedupe_key

logger = logging.getLogger("webhooks.resend")

TERMINAL = (DeliveryState.EXHAUSTED, DeliveryState.REFUSED)


def resend_delivery(delivery_id: int, *, actor=None, states: Iterable[str] = TERMINAL, reason: str = "") -> bool:
    """CAS ``<one of states> → pending`` with a fresh ladder; False if it was in none of them.
    ``reason`` (the operator's why) is recorded on the delivery's History with the actor."""
    with transaction.atomic():
        merchant_id = repository.reopen_delivery(delivery_id, [str(s) for s in states])
        if merchant_id is None:
            return False
        # The job of the run that ended the delivery may still be live (leased while that run
        # finishes, or held by the batch that carried it): woken, it runs again.
        enqueue_or_wake(
            JobKind.WEBHOOK_DELIVER,
            {"delivery_id": delivery_id},
            dedupe_key=dedupe_key(delivery_id),
            tenant=merchant_id,
        )
        message = "Resent (fresh retry ladder)" + (f": {reason}" if reason else ".")
        log_change(actor, WebhookDelivery, delivery_id, f"delivery {delivery_id}", message)
    logger.info(
        "webhook delivery resent", extra={"delivery_id": delivery_id, "actor": str(actor or ""), "reason": reason}
    )
    return True
