"""The outbox drain: pending events become one delivery per subscribed endpoint.

One transaction per event, never one per page: a crash mid-page loses nothing and
duplicates nothing. Inside it: lock the event (SKIP LOCKED: a concurrent drain's event is
skipped, not waited for), create its deliveries (unique ``(event, endpoint)``), enqueue a
deliver job per delivery (dedupe key), and compare-and-swap the event to ``fanned_out``.
A replay of that transaction is absorbed by the unique index and the dedupe key; a CAS
that matches nothing means another drain fanned it out, and ours rolls back (not a failure).

A failing event is counted in a separate statement (its own transaction rolled back), and
abandoned with one alert after ``FAN_OUT_MAX_PASSES`` failed passes. Only failures of the
event count: an error ``vpay.errors.classify`` calls transient (a statement or lock
timeout, a dropped connection: the database, not the event) is logged and retried by the
next pass without counting, so a migration holding a lock cannot abandon a backlog.
An abandoned event goes back to ``pending`` only by an operator's re-drive
(``webhooks.services.redrive``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError, transaction
from django.urls import reverse

from jobs.alerts import Severity, raise_alert
from jobs.kinds import JobKind
from jobs.queue import JobRequest, enqueue_many
from vpay.errors import Category, classify, error_chain
from webhooks import metrics, repository
from webhooks.decisions import FAN_OUT_MAX_PASSES, FanOut, fan_out_disposition
from webhooks.services.delivery import dedupe_key

logger = logging.getLogger("webhooks.fanout")

PAGE = 100


class _NotOurs(Exception):
    """The closing CAS matched nothing: another drain fanned the event out; roll back."""


@dataclass
class Pass:
    """What one drain pass did."""

    seen: int = 0
    fanned_out: int = 0
    deliveries: int = 0
    failed: int = 0
    transient: int = 0  # failed with a transient (database-side) error: not counted
    abandoned: int = 0

    @property
    def progress(self) -> bool:
        return self.fanned_out > 0


def fan_out_event(event_id: str) -> int | None:
    """Fan one event out in one transaction; returns how many deliveries it has, or None
    when it was not ours to fan out (locked by another drain, or no longer pending)."""
    try:
        with transaction.atomic():
            locked = repository.lock_pending_event(event_id)
            if locked is None:
                return None
            merchant_id, event_type = locked
            deliveries = repository.create_deliveries(event_id, merchant_id, event_type)
            enqueue_many(
                JobRequest(
                    kind=JobKind.WEBHOOK_DELIVER,
                    payload={"delivery_id": delivery_id},
                    dedupe_key=dedupe_key(delivery_id),
                    tenant=endpoint_id,  # fair claims across endpoints
                    correlation_id=event_id,
                )
                for delivery_id, endpoint_id in deliveries
            )
            if not repository.mark_fanned_out(event_id):
                raise _NotOurs
            return len(deliveries)
    except _NotOurs:
        return None


def drain_once(page: int = PAGE) -> Pass:
    """One page of pending events, each in its own transaction; failures counted apart."""
    result = Pass()
    for event_id in repository.pending_event_ids(page):
        result.seen += 1
        try:
            made = fan_out_event(event_id)
        except Exception as exc:  # noqa: BLE001 - one event's failure must not stop the page
            result.failed += 1
            if classify(exc).category is Category.TRANSIENT:
                result.transient += 1
                logger.warning(
                    "fan-out of an event hit a transient error; not counted, the next pass retries it",
                    extra={"event_id": event_id, "error": error_chain(exc, 500)},
                )
                continue
            if _count_failure(event_id, exc):
                result.abandoned += 1
            continue
        if made is not None:
            metrics.EVENTS_FANNED_OUT.inc()
            result.fanned_out += 1
            result.deliveries += made
    return result


def abandoned_alert_key(event_id: str, redrives: int) -> str:
    """One alert per abandonment: a re-driven event that is abandoned again alerts again."""
    return f"webhook_event_abandoned:{event_id}" + (f":{redrives}" if redrives else "")


def _count_failure(event_id: str, exc: Exception) -> bool:
    """Count the failure; returns True if this pass abandoned the event (and alerted)."""
    try:
        failures = repository.count_fan_out_failure(event_id)
        disposition = fan_out_disposition(failures, FAN_OUT_MAX_PASSES)
        abandoned = False
        if disposition is FanOut.ABANDON:
            with transaction.atomic():
                redrives = repository.mark_abandoned(event_id)
                abandoned = redrives is not None
                if abandoned:  # only the pass that made the transition alerts
                    raise_alert(
                        key=abandoned_alert_key(event_id, redrives),
                        title=f"Event {event_id} abandoned: its fan-out failed on every pass",
                        source="webhooks.event_abandoned",
                        severity=Severity.ERROR,
                        details={"event_id": event_id, "passes": failures, "error": error_chain(exc, 500)},
                        link=reverse("admin:webhooks_event_change", args=[event_id]),
                        correlation_id=event_id,
                    )
    except DatabaseError as count_exc:
        # The pass has already decided to go on; failing to count must not stop the drain.
        logger.warning(
            "could not count a fan-out failure",
            extra={"event_id": event_id, "error": error_chain(count_exc, 300)},
        )
        return False
    if abandoned:
        metrics.EVENTS_ABANDONED.inc()
        logger.error(
            "event abandoned: fan-out failed on every pass (alert raised)",
            extra={"event_id": event_id, "passes": failures, "error": error_chain(exc, 1000)},
        )
    elif disposition is FanOut.RETRY:
        logger.warning(
            "fan-out of an event failed; the next pass retries it",
            extra={"event_id": event_id, "failures": failures, "error": error_chain(exc, 500)},
        )
    return abandoned
