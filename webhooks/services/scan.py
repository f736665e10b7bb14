"""The backstop behind every delivery: expired leases recovered, lost jobs re-enqueued.

A deliver job can be lost (an operator deleted it, a dead letter was discarded, a bug):
then a due ``pending`` delivery would wait forever. Every scan re-enqueues due deliveries
under their dedupe key (a live job makes that a no-op) and recovers attempts whose lease
expired because their worker died, so "nothing accepted is lost" does not depend on the
job that was supposed to carry each delivery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from jobs.kinds import JobKind
from jobs.port import JobRequest, enqueue_many
from webhooks import repository
from webhooks.models import DeliveryState
from webhooks.services.delivery import dedupe_key, recover_expired

logger = logging.getLogger("webhooks.scan")

PAGE = 500
# A due delivery is only "lost" once it has been due this long: a backlog being worked
# right now is not what the backstop is for.
OVERDUE_SECONDS = 30.0
LOGGED_IDS = 20


@dataclass
class ScanResult:
    recovered: int = 0
    exhausted: int = 0
    requeued: int = 0


def scan_once(*, overdue_seconds: float = OVERDUE_SECONDS, page: int = PAGE) -> ScanResult:
    """One backstop pass (see the module docstring)."""
    result = ScanResult()
    for delivery_id in repository.expired_leases(page):
        state = recover_expired(delivery_id)
        if state == DeliveryState.PENDING:
            result.recovered += 1
        elif state == DeliveryState.EXHAUSTED:
            result.exhausted += 1
    # One transaction for the page: every enqueue has the same fixed shape (no merchant-
    # authored value), so there is no per-row failure to isolate.
    with transaction.atomic():
        due = repository.due_deliveries(page, overdue_seconds)
        result.requeued = enqueue_many(
            JobRequest(
                kind=JobKind.WEBHOOK_DELIVER,
                payload={"delivery_id": delivery_id},
                dedupe_key=dedupe_key(delivery_id),
                tenant=merchant_id,
            )
            for delivery_id, merchant_id in due
        )
    if result.requeued:
        # The count is exact; the list is cut so the line survives log collectors.
        logger.warning(
            "re-enqueued due webhook deliveries that had lost their job",
            extra={"count": result.requeued, "some_ids": ",".join(str(d) for d, _ in due[:LOGGED_IDS])},
        )
    return result
