"""The outbox drain: pending events become one delivery per subscribed endpoint.

A page of pending events goes in one transaction: lock the page (SKIP LOCKED: events a
concurrent drain holds are skipped, not waited for), create its deliveries (unique
``(event, endpoint)``), enqueue a deliver job per delivery (dedupe key), and
compare-and-swap the events to ``fanned_out``. A crash mid-page loses nothing and
duplicates nothing: the transaction is all or nothing, and a replay is absorbed by the
unique index and the dedupe key. One commit per page, not one per event: under load the
drain is one executor among many sharing the worker's interpreter, and at a transaction
per event it fell behind the events (bench/CHARGES.md).

A page that fails as a whole is done again event by event, each in its own transaction
(lock the event, its deliveries, its jobs, its CAS), so one failing event is found and
never holds the others back; a CAS that matches nothing there means another drain fanned
the event out, and ours rolls back (not a failure). An event whose fan-out has failed
before (counted, below) is never in a page again: it goes one per transaction on every
pass, so one that keeps failing, transiently forever or until abandoned, costs its own
transaction and not every page's.

A failing event is counted in a separate statement (its own transaction rolled back), and
abandoned with one alert after ``FAN_OUT_MAX_PASSES`` failed passes. Only failures of the
event count: an error ``vpay.errors.classify`` calls transient (a statement or lock
timeout, a dropped connection: the database, not the event) is logged and retried by the
next pass without counting toward abandonment, so a migration holding a lock cannot
abandon a backlog. Those passes are counted apart (``fan_out_transient_failures``): an
event that keeps failing transiently stays ``pending`` and is retried on every pass, and
the pass that reaches ``FAN_OUT_TRANSIENT_ALERT_AFTER`` raises one alert, so a statement
that times out forever cannot be retried forever unseen. An abandoned event goes back to
``pending`` only by an operator's re-drive (``webhooks.services.redrive``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, transaction

from jobs.kinds import JobKind
from jobs.operator.alerts import Severity, admin_change_path, raise_alert
from jobs.port import JobRequest, enqueue_many
from vpay import faultpoints
from vpay.errors import Category, classify, error_chain
from webhooks import metrics, repository
from webhooks.decisions import (
    FAN_OUT_MAX_PASSES,
    FAN_OUT_TRANSIENT_ALERT_AFTER,
    FanOut,
    fan_out_disposition,
    stuck_alert_due,
)
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


def _fan_out(lock: Callable[[], list[str]]) -> tuple[int, int] | None:
    """One transaction: the events ``lock()`` row-locks, their deliveries, a deliver job per
    delivery, and their CAS to ``fanned_out``. ``(events, deliveries)``, or None when none
    was ours (held by another drain, or no longer pending)."""
    try:
        with transaction.atomic():
            event_ids = lock()
            if not event_ids:
                return None
            deliveries = repository.create_deliveries(event_ids)
            enqueue_many(
                JobRequest(
                    kind=JobKind.WEBHOOK_DELIVER,
                    payload={"delivery_id": delivery_id},
                    dedupe_key=dedupe_key(delivery_id),
                    # The claim is fair across merchants; one endpoint's share of the
                    # executors is the webhook cap's business (webhooks/services/delivery.py).
                    tenant=merchant_id,
                    correlation_id=event_id,
                )
                for delivery_id, event_id, merchant_id in deliveries
            )
            faultpoints.reached("fan_out.deliveries_written")
            if repository.mark_fanned_out(event_ids) != len(event_ids):
                raise _NotOurs  # under our row locks only a bug gets here: never commit a part
            return len(event_ids), len(deliveries)
    except _NotOurs:
        return None


def fan_out_event(event_id: str) -> int | None:
    """Fan one event out in one transaction; returns how many deliveries it has, or None
    when it was not ours to fan out (locked by another drain, or no longer pending)."""
    done = _fan_out(lambda: repository.lock_pending_events([event_id]))
    return None if done is None else done[1]


def drain_once(page: int = PAGE, *, transient_alert_after: int = FAN_OUT_TRANSIENT_ALERT_AFTER) -> Pass:
    """A page of pending events in one transaction, then each event that has failed before
    in its own transaction, failures counted apart; after a page that failed, each event
    of the next page in its own transaction."""
    result = Pass()
    page_failed = False
    try:
        done = _fan_out(lambda: repository.lock_pending_page(page))
    except Exception as exc:  # noqa: BLE001 - event by event next, where each failure is counted
        page_failed = True
        logger.warning("fan-out page failed as a whole; going event by event", extra={"error": error_chain(exc, 300)})
    else:
        if done is not None:
            result.seen = done[0]
            _committed(result, *done)
    for event_id in repository.pending_event_ids(page, failed_before=not page_failed):
        result.seen += 1
        try:
            made = fan_out_event(event_id)
        except Exception as exc:  # noqa: BLE001 - one event's failure must not stop the page
            result.failed += 1
            if classify(exc).category is Category.TRANSIENT:
                result.transient += 1
                _count_transient(event_id, exc, transient_alert_after)
                continue
            if _count_failure(event_id, exc):
                result.abandoned += 1
            continue
        if made is not None:
            _committed(result, 1, made)
    return result


def _committed(result: Pass, events: int, deliveries: int) -> None:
    metrics.EVENTS_FANNED_OUT.inc(events)
    result.fanned_out += events
    result.deliveries += deliveries
    faultpoints.reached("fan_out.event_committed")


def abandoned_alert_key(event_id: str, redrives: int) -> str:
    """One alert per abandonment: a re-driven event that is abandoned again alerts again."""
    return f"webhook_event_abandoned:{event_id}" + (f":{redrives}" if redrives else "")


def stuck_alert_key(event_id: str, redrives: int) -> str:
    """One alert per event stuck on transient failures (per re-drive, like abandonment)."""
    return f"webhook_event_stuck:{event_id}" + (f":{redrives}" if redrives else "")


def _count_transient(event_id: str, exc: Exception, alert_after: int) -> None:
    """Count a transient failure apart from the abandoning ones; the pass that reaches
    ``alert_after`` alerts, in the counting transaction (an alert that fails to commit
    un-counts the pass, so the next one reaches the bound again)."""
    try:
        with transaction.atomic():
            counted = repository.count_transient_fan_out_failure(event_id)
            transient_failures = counted[0] if counted else None
            alerted = stuck_alert_due(transient_failures, alert_after)
            if alerted:
                assert counted is not None  # stuck_alert_due() is False for an uncounted pass
                raise_alert(
                    key=stuck_alert_key(event_id, counted[1]),
                    title=f"Event {event_id} is stuck: its fan-out keeps failing on a transient error",
                    source="webhooks.event_stuck",
                    severity=Severity.ERROR,
                    details={
                        "event_id": event_id,
                        "transient_failures": transient_failures,
                        "error": error_chain(exc, 500),
                    },
                    link=admin_change_path("webhooks_event", event_id),
                    correlation_id=event_id,
                )
    except DatabaseError as count_exc:
        # The database is what failed; failing to count that must not stop the drain.
        logger.warning(
            "could not count a transient fan-out failure",
            extra={"event_id": event_id, "error": error_chain(count_exc, 300)},
        )
        transient_failures, alerted = None, False
    if alerted:
        logger.error(
            "event's fan-out keeps failing transiently; still pending, retried every pass (alert raised)",
            extra={"event_id": event_id, "transient_failures": transient_failures, "error": error_chain(exc, 1000)},
        )
    else:
        logger.warning(
            "fan-out of an event hit a transient error; not counted toward abandoning it, the next pass retries it",
            extra={"event_id": event_id, "transient_failures": transient_failures, "error": error_chain(exc, 500)},
        )


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
                if redrives is not None:  # abandoned: only the pass that made the transition alerts
                    raise_alert(
                        key=abandoned_alert_key(event_id, redrives),
                        title=f"Event {event_id} abandoned: its fan-out failed on every pass",
                        source="webhooks.event_abandoned",
                        severity=Severity.ERROR,
                        details={"event_id": event_id, "passes": failures, "error": error_chain(exc, 500)},
                        link=admin_change_path("webhooks_event", event_id),
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
