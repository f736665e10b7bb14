"""``sweep_expired``: the hourly housekeeping singleton of the queue.

Independent statements, each its own transaction (autocommit), so one failing does not
roll back the others: expired ``processed_jobs`` rows (in pages) and expired job leases.
The lease reap is here as well as in every worker because a job cannot recover its own
lease: when the only worker dies holding this job, the next worker's boot reaper frees it.
Later apps add their own expiries to this sweep.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError

from jobs import registry, repository
from jobs.context import JobContext
from jobs.kinds import JobKind
from jobs.outcome import Outcome
from jobs.schema import PayloadSchema
from vpay.errors import error_chain

logger = logging.getLogger(__name__)

SWEEP_EVERY_SECONDS = 3600.0
FENCE_PAGE = 1000
MAX_FENCE_PAGES = 100  # at most 100k fence rows a pass; the next pass continues


@registry.register(
    JobKind.SWEEP_EXPIRED,
    schema=PayloadSchema(),
    timeout_seconds=300.0,
    singleton=registry.Singleton(),
)
def sweep_expired(ctx: JobContext) -> Outcome:
    counts = {"processed_jobs": 0, "leases_released": 0, "leases_dead_lettered": 0}
    failures = []
    try:
        for _ in range(MAX_FENCE_PAGES):
            deleted = repository.delete_expired_fences(FENCE_PAGE)
            counts["processed_jobs"] += deleted
            if deleted < FENCE_PAGE:
                break
            ctx.heartbeat()
    except DatabaseError as exc:
        failures.append(("processed_jobs", exc))
    try:
        counts["leases_released"], counts["leases_dead_lettered"] = repository.reap_expired_leases()
    except DatabaseError as exc:
        failures.append(("leases", exc))
    for what, exc in failures:
        logger.warning("sweep statement failed", extra={"statement": what, "error": error_chain(exc, 300)})
    logger.info("sweep_expired", extra=counts)
    if len(failures) == 2:  # nothing worked: let the retry policy see it
        raise failures[0][1]
    return Outcome.reschedule_in(SWEEP_EVERY_SECONDS)  # the singleton's row lives on, an hour out
