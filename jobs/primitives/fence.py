"""The ``processed_jobs`` fence: one effect per ``job_id``, however often the job runs.

A handler whose effect is not naturally a compare-and-swap writes it inside
``transaction.atomic()`` together with :func:`first_time`::

    with transaction.atomic():
        if not fence.first_time(ctx.job_id, ctx.kind):
            return Outcome.done()          # a duplicate: ack and skip
        ...the effect...

The fence row and the effect commit or roll back together, so a crash between them
leaves neither. Two concurrent runs of one ``job_id`` serialize on the primary key: the
second waits for the first to commit and then sees a conflict.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.db import connection

from jobs.storage import fence_sql
from vpay import metrics

logger = logging.getLogger(__name__)


def ttl_seconds() -> float:
    return float(settings.VPAY_PROCESSED_JOBS_TTL_SECONDS)


def first_time(job_id: uuid.UUID, kind: str, subject: str = "") -> bool:
    """Record ``job_id`` as processed; False (and a metric) when it already was.

    MUST be called inside the transaction that makes the job's effect.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("fence.first_time() must run inside the transaction that makes the effect")
    if fence_sql.insert_fence(job_id, kind, subject, ttl_seconds()):
        return True
    metrics.DUPLICATES_SKIPPED.labels(kind=kind).inc()
    logger.info("duplicate job skipped by the fence", extra={"job_id": str(job_id), "kind": kind})
    return False
