"""Endpoint health: warn about, then disable, an endpoint whose deliveries only fail; and the
merchant's or an operator's disable and re-enable (docs/webhooks.md "Endpoint health").

The check is a step of the hourly ``sweep_expired`` (``endpoint_health``), not a reaction to
each attempt: one page of enabled endpoints at a time (keyset by id, the step's cursor in
the sweep's checkpoint), one transaction per endpoint. For each, the failing streak is read
from the database (``webhooks.health_sql``), judged by the pure
:func:`webhooks.health_decisions.decide`, and acted on with a compare-and-swap that repeats
the decision's premises, together with the event and the alert it owes:

* **warn**: ``webhook_endpoint.failing`` to the merchant's *other* endpoints and one
  logged alert (``alert=true``), once per streak;
* **disable**: ``disabled_at`` with a reason, ``webhook_endpoint.disabled`` to the other
  endpoints, and one alert.

A disabled endpoint gets no new deliveries and sends nothing; its pending deliveries stay
``pending`` (their jobs end, nothing is spent). Re-enabling (:func:`endpoint_enable`) gives
it a fresh health record and makes those deliveries due now.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from jobs.kinds import JobKind
from jobs.maintenance.housekeeping import StepResult
from jobs.maintenance.paging import sweep_in_pages
from jobs.operator.alerts import Severity, admin_change_path, raise_alert
from jobs.port import JobRequest, enqueue_many, enqueue_or_wake
from jobs.runner.context import JobContext
from vpay.admin_log import log_change
from vpay.errors import InvalidInput
from webhooks import health_sql
from webhooks.endpoint_wire import render_endpoint
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.health_decisions import Evidence, Verdict, decide
from webhooks.models import WebhookEndpoint
from webhooks.services.delivery import dedupe_key

logger = logging.getLogger("webhooks.endpoint_health")

DAY = 86400.0
REASON_MAX = 300
DISABLED_BY_VPAY = "vpay"
DISABLED_BY_MERCHANT = "merchant"


def window_seconds() -> float:
    """``VPAY_WEBHOOK_DISABLE_AFTER_DAYS`` in seconds; 0 switches the check off."""
    return float(settings.VPAY_WEBHOOK_DISABLE_AFTER_DAYS) * DAY


def _link(endpoint_id: str) -> str:
    return admin_change_path("webhooks_webhookendpoint", endpoint_id)


def _days(seconds: float) -> str:
    return f"{seconds / DAY:.1f} days"


def check_endpoint(endpoint_id: str) -> Verdict | None:
    """Judge one endpoint and act; the verdict acted on, or None when nothing changed."""
    window = window_seconds()
    with transaction.atomic():
        streak = health_sql.current_streak(endpoint_id, lookback_seconds=2 * window)
        if streak is None:
            return None
        verdict = decide(Evidence(streak.span_seconds, streak.warned_seconds_ago), window)
        if verdict is Verdict.WARN:
            merchant_id = health_sql.mark_warned(endpoint_id, streak.first_at)
            if merchant_id is None:
                return None
            endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
            emit(merchant_id, EventType.WEBHOOK_ENDPOINT_FAILING, render_endpoint(endpoint))
            raise_alert(
                key=f"webhook_endpoint_failing:{endpoint_id}:{int(streak.first_at.timestamp() * 1e6)}",
                title=f"Webhook endpoint {endpoint_id} has only failed for {_days(streak.span_seconds)};"
                f" it will be disabled at {_days(window)}",
                source="webhooks.endpoint_failing",
                severity=Severity.WARNING,
                details={"endpoint_id": endpoint_id, "merchant_id": merchant_id, "failing_for": streak.span_seconds},
                link=_link(endpoint_id),
            )
            logger.warning("webhook endpoint failing: merchant warned", extra={"endpoint_id": endpoint_id})
            return verdict
        if verdict is Verdict.DISABLE:
            reason = (
                f"Every delivery attempt failed for {_days(streak.span_seconds)} (the limit is {_days(window)});"
                " re-enable it once it answers 2xx: its pending deliveries resume."
            )
            merchant_id = health_sql.disable_failing(
                endpoint_id, streak.first_at, half_window_seconds=window / 2, reason=reason[:REASON_MAX]
            )
            if merchant_id is None:
                return None
            _disabled(endpoint_id, merchant_id, by=DISABLED_BY_VPAY)
            return verdict
    return None


def health_step(ctx: JobContext) -> StepResult:
    """Sweep step ``endpoint_health``: every enabled endpoint, a page of 100 at a time."""
    if window_seconds() <= 0:
        return StepResult(0)
    result = sweep_in_pages(
        ctx,
        label="endpoint_health",
        read_page=health_sql.endpoints_page,
        retire=lambda key: check_endpoint(key[-1]) is not None,
    )
    return StepResult(result.retired, more=result.more, failed=result.failed)


def _disabled(endpoint_id: str, merchant_id: str, *, by: str) -> None:
    """What every disable owes, in its transaction: the event to the other endpoints, and
    (when vpay did it) an alert."""
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    emit(merchant_id, EventType.WEBHOOK_ENDPOINT_DISABLED, render_endpoint(endpoint))
    if by == DISABLED_BY_VPAY:
        assert endpoint.disabled_at is not None  # disabled in this transaction
        raise_alert(
            key=f"webhook_endpoint_disabled:{endpoint_id}:{int(endpoint.disabled_at.timestamp() * 1e6)}",
            title=f"Webhook endpoint {endpoint_id} was disabled: its deliveries only failed",
            source="webhooks.endpoint_disabled",
            severity=Severity.ERROR,
            details={"endpoint_id": endpoint_id, "merchant_id": merchant_id, "reason": endpoint.disabled_reason},
            link=_link(endpoint_id),
        )
    logger.warning("webhook endpoint disabled", extra={"endpoint_id": endpoint_id, "disabled_by": by})


def clean_reason(reason: str) -> str:
    """A disable's reason: stripped, non-empty, at most :data:`REASON_MAX` characters;
    :class:`~vpay.errors.InvalidInput` otherwise."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("parameter_missing", "A reason is required.", param="reason")
    if len(reason) > REASON_MAX:
        raise InvalidInput("parameter_too_long", f"A reason is at most {REASON_MAX} characters.", param="reason")
    return reason


def endpoint_disable(*, endpoint_id: str, reason: str, actor: str, user_id: int | None = None) -> bool:
    """Disable an enabled endpoint (the merchant's or an operator's choice): nothing more is
    sent to it and no new delivery is made for it; its pending deliveries wait. Emits
    ``webhook_endpoint.disabled``; an operator's (``user_id``) is on the endpoint's admin
    History. False when it was not enabled (already disabled, deleted)."""
    reason = clean_reason(reason)
    with transaction.atomic():
        merchant_id = health_sql.disable(endpoint_id, reason=reason, actor=actor[:150])
        if merchant_id is None:
            return False
        _disabled(endpoint_id, merchant_id, by=actor)
        log_change(user_id, WebhookEndpoint, endpoint_id, f"endpoint {endpoint_id}", f"Disabled: {reason}")
    return True


def _run_each_again(merchant_id: str, delivery_ids: list[int]) -> None:
    for delivery_id in delivery_ids:
        enqueue_or_wake(
            JobKind.WEBHOOK_DELIVER,
            {"delivery_id": delivery_id},
            dedupe_key=dedupe_key(delivery_id),
            tenant=merchant_id,
        )


def endpoint_enable(*, endpoint_id: str, actor: str, reason: str = "", user_id: int | None = None) -> int | None:
    """Re-enable a disabled endpoint: a fresh health record (failures before now do not
    count), and its pending deliveries due now, their jobs enqueued (or pulled forward).
    An operator's (``user_id``, with ``reason``) is on the endpoint's admin History.
    Returns how many deliveries resumed; None when it was not disabled."""
    with transaction.atomic():
        enabled = health_sql.enable(endpoint_id)
        if enabled is None:
            return None
        log_change(user_id, WebhookEndpoint, endpoint_id, f"endpoint {endpoint_id}", f"Re-enabled: {reason}")
        merchant_id, resumed = enabled
        created = enqueue_many(
            JobRequest(
                kind=JobKind.WEBHOOK_DELIVER,
                payload={"delivery_id": delivery_id},
                dedupe_key=dedupe_key(delivery_id),
                tenant=merchant_id,
            )
            for delivery_id in resumed
        )
        if created < len(resumed):
            # Some names were taken: a job waiting for a later rung (due now, like the delivery),
            # or the job of a run that found the endpoint disabled and is finishing (woken, it runs
            # again; gone meanwhile, enqueued again). After the commit, one name per statement: a
            # wake may wait for a finishing job's row, and holds no other row while it does.
            transaction.on_commit(lambda: _run_each_again(merchant_id, resumed))
    logger.info("webhook endpoint enabled", extra={"endpoint_id": endpoint_id, "by": actor, "resumed": len(resumed)})
    return len(resumed)
