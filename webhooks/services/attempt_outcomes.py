"""What a recorded delivery attempt leaves besides its rows: the alert of an exhaustion or a
refusal (in the record's transaction) and the metrics and log lines (after it). Called by
``webhooks.services.delivery.record_many`` for each attempt of a batch."""

from __future__ import annotations

import logging

from webhooks import metrics
from webhooks.attempt_batch_sql import Outcome
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services import delivery_alerts
from webhooks.services.sending import Attempted

logger = logging.getLogger("webhooks.delivery")


def alert(outcome: Outcome, attempted: Attempted) -> None:
    """Counted by the writer that made the transition, in its transaction: exactly once
    (one page per endpoint and period: webhooks.services.delivery_alerts)."""
    if outcome.delivery_state not in (DeliveryState.EXHAUSTED, DeliveryState.REFUSED):
        return
    delivery = WebhookDelivery.objects.get(pk=outcome.lease.delivery_id)
    if outcome.delivery_state == DeliveryState.EXHAUSTED:
        delivery_alerts.alert_exhausted(
            delivery_id=delivery.pk,
            endpoint_id=delivery.endpoint_id,
            event_id=delivery.event_id,
            attempts=outcome.lease.number,
        )
    else:
        delivery_alerts.alert_refused(
            delivery_id=delivery.pk,
            endpoint_id=delivery.endpoint_id,
            event_id=delivery.event_id,
            reason=attempted.detail or attempted.error,
        )


def account(outcome: Outcome, attempted: Attempted, moved: bool) -> None:
    """One recorded attempt's metrics and log lines."""
    lease = outcome.lease
    metrics.ATTEMPTS.labels(outcome=str(attempted.attempt_state) if moved else "stale").inc()
    if attempted.duration_ms is not None:
        metrics.ATTEMPT_DURATION.observe(attempted.duration_ms / 1000)
    if moved and outcome.delivery_state != DeliveryState.PENDING:
        metrics.DELIVERIES_FINISHED.labels(state=str(outcome.delivery_state)).inc()
    if attempted.detail:
        # The operators' account of what the merchant reads as a fixed phrase (the attempt
        # row keeps only that): the resolved address, the exception chain.
        logger.log(
            logging.WARNING if outcome.delivery_state == DeliveryState.REFUSED else logging.INFO,
            "webhook attempt failed: %s",
            attempted.error,
            extra={"delivery_id": lease.delivery_id, "attempt": lease.number, "error": attempted.detail},
        )
    if not moved:
        logger.warning(
            "webhook attempt was stale: its lease expired first; answer discarded",
            # The row may already be abandoned (and keeps that): this line is where what the
            # late finisher heard is still told.
            extra={"delivery_id": lease.delivery_id, "attempt": lease.number, "status_code": attempted.status_code},
        )
