"""The alerts a delivery's end raises: refused by the SSRF guard, or exhausted its ladder.

Both are things a merchant can cause as often as it likes (a ``/test`` loop to an endpoint
on a private address, an endpoint that answers 500 to everything), so they are counted per
endpoint and per ``VPAY_WEBHOOK_ALERT_PERIOD_SECONDS`` (``jobs.operator.alerts.raise_counted_alert``):
the period's first refusal (exhaustion) of an endpoint's deliveries alerts at once, the
rest are counted on one tally sent when the period ends. The deliveries themselves are the
record (state ``refused`` / ``exhausted``; the runbooks' queries list them); the alert gets
someone to look. Each MUST run in the transaction that made the transition.
"""

from __future__ import annotations

from django.conf import settings

from jobs.operator.alerts import Severity, admin_change_path, raise_counted_alert


def _endpoint_link(endpoint_id: str) -> str:
    return admin_change_path("webhooks_webhookendpoint", endpoint_id)


def alert_refused(*, delivery_id: int, endpoint_id: str, event_id: str, reason: str) -> None:
    """A delivery refused by the SSRF guard; ``reason`` is the operators' detail (the address
    and why it is not public), never shown to the merchant."""
    raise_counted_alert(
        key=f"webhook_endpoint_refused:{endpoint_id}",
        period=settings.VPAY_WEBHOOK_ALERT_PERIOD_SECONDS,
        title=f"Webhook endpoint {endpoint_id}: a delivery was refused by the SSRF guard",
        more_title=f"Webhook endpoint {endpoint_id}: more deliveries refused by the SSRF guard",
        source="webhooks.delivery_refused",
        severity=Severity.ERROR,
        details={"endpoint_id": endpoint_id},
        occurrence={"delivery_id": delivery_id, "event_id": event_id, "reason": reason[:300]},
        link=_endpoint_link(endpoint_id),
        correlation_id=event_id,
    )


def alert_exhausted(*, delivery_id: int, endpoint_id: str, event_id: str, attempts: int) -> None:
    """A delivery that failed every rung of its ladder. Nothing here is broken, the receiver
    is; but vpay will never tell the merchant, so a human must."""
    raise_counted_alert(
        key=f"webhook_endpoint_exhausted:{endpoint_id}",
        period=settings.VPAY_WEBHOOK_ALERT_PERIOD_SECONDS,
        title=f"Webhook endpoint {endpoint_id}: a delivery exhausted its retry ladder",
        more_title=f"Webhook endpoint {endpoint_id}: more deliveries exhausted their retry ladder",
        source="webhooks.delivery_exhausted",
        severity=Severity.ERROR,
        details={"endpoint_id": endpoint_id},
        occurrence={"delivery_id": delivery_id, "event_id": event_id, "attempts": attempts},
        link=_endpoint_link(endpoint_id),
        correlation_id=event_id,
    )
