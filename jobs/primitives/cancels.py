"""Cooperative cancel, the runner's side: the SQL that locks, requests, ends and sweeps.

An operator's cancel (``jobs.services.cancels``) ends a waiting job at once, and so a job
whose worker is dead; a running one gets a request on its row (who, why, when, on the
database clock). From there the runner guarantees the request is never lost and the job
never starts another attempt:

* the handler's next ``heartbeat()`` raises :class:`~jobs.runner.current.JobCancelled`; the run
  settles as cancelled (:func:`settle_cancelled`), after a fenced job's transaction rolled
  back;
* a run that answers *retry, reschedule or defer* anyway is not re-queued: the reschedule
  refuses a row with a request (``jobs.storage.repository._RESCHEDULE``) and the settle ends it
  cancelled instead;
* a run handed back without a settle (the database went away, grace ran out, its worker
  died and the reaper freed it) is ended by :func:`sweep_waiting` at the next beat;
* a run that *finishes* first stands: its effect happened and its answer is kept. The
  request is overtaken (``jobs cancel --wait`` reports it).

Every cancelled job becomes a dead letter with cause ``cancelled``, closed as discarded by
whoever asked, with their reason: never dropped, raising no alert.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.db import connection

from jobs.models import LAST_ERROR_MAX, DeadLetterCause
from jobs.primitives.cancel_decisions import JobPhase
from jobs.storage import sql
from jobs.storage.leases import ClaimedJob
from jobs.storage.repository import DEAD_LETTER_COLUMNS
from vpay import metrics

logger = logging.getLogger("jobs.runner.worker")

# The dead letter of a cancelled job, from a `gone` CTE of deleted job rows and the who and
# why given as `{actor}` and `{reason}` (SQL expressions): closed as discarded, so it is not
# pending review and raises no alert (the operator who cancelled is the human who knows).
_LETTER_FROM_GONE = f"""
INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS}, state, discarded_by, discarded_at, discard_reason)
SELECT job_id, kind, queue, payload, priority, tenant, correlation_id, attempts, max_attempts,
       '{DeadLetterCause.CANCELLED.value}', '', left({{describe}}, {LAST_ERROR_MAX}),
       created_at, dedupe_key, 'discarded', {{actor}}, now(), {{reason}}
  FROM gone
RETURNING id, job_id, kind
"""

# --- the operator's cancel (one transaction: lock, read, decide, write) -------------------

# Take the job's row lock (index jobs_job_job_id_unique, or the primary key), so the phase
# read next and the write after it act on a row no claim, settle or reaper moves meanwhile
# (a claim skips locked rows; a settle or a heartbeat waits the few milliseconds).
_LOCK_BY_JOB_ID = "SELECT id FROM jobs WHERE job_id = %s FOR UPDATE"
_LOCK_BY_PK = "SELECT id FROM jobs WHERE id = %s FOR UPDATE"

# The locked row's phase, read by a statement of its own: its snapshot is taken after the
# lock was granted, so a claim that committed while we waited, and its worker's row, are
# seen. Orphaned: leased by a worker the reaper would judge dead (jobs.maintenance.reaper): its
# `workers` row's beat is older than its own lease, or it has no row (pruned after four
# silent leases, or never beat) and the job's lease ran out. A lapsed lease under a worker
# that still beats is not orphaned: death is read from the beat. Primary keys of jobs and
# workers.
_PHASE = """
SELECT j.kind,
       CASE WHEN j.locked_at IS NULL THEN 'waiting'
            WHEN coalesce((SELECT w.heartbeat_at < now() - make_interval(secs => w.lease_seconds)
                             FROM workers w WHERE w.id = j.locked_by),
                          j.lease_expires_at < now())
              THEN 'orphaned'
            ELSE 'running' END,
       j.cancel_requested_at IS NOT NULL, j.cancel_requested_by, j.locked_by
  FROM jobs j
 WHERE j.id = %s
"""


@dataclass(frozen=True, slots=True)
class LockedJob:
    id: int
    kind: str
    phase: JobPhase
    requested: bool
    requested_by: str
    locked_by: str | None


def lock_for_cancel(*, job_id: uuid.UUID | None = None, job_pk: int | None = None) -> LockedJob | None:
    """Lock the job's row and read its phase; None when there is no such live job. Must run
    inside the caller's transaction (the lock lasts until it ends)."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_for_cancel() must run inside a transaction")
    with connection.cursor() as cursor:
        if job_id is not None:
            cursor.execute(_LOCK_BY_JOB_ID, [job_id])
        else:
            cursor.execute(_LOCK_BY_PK, [job_pk])
        row = cursor.fetchone()
        if row is None:
            return None
        pk = row[0]
        cursor.execute(_PHASE, [pk])
        kind, phase, requested, requested_by, locked_by = cursor.fetchone()
    return LockedJob(pk, kind, JobPhase(phase), requested, requested_by, locked_by)


# End a job now (the caller holds its row lock, primary key): waiting, or its worker dead.
_END_NOW = "WITH gone AS (DELETE FROM jobs WHERE id = %(id)s RETURNING *)\n" + _LETTER_FROM_GONE.format(
    describe="'cancelled by ' || %(actor)s || ': ' || %(reason)s"
    " || CASE WHEN locked_by IS NULL THEN ''"
    " ELSE ' (its worker ' || locked_by || ' was dead: cancelled without waiting for it)' END",
    actor="%(actor)s",
    reason="%(reason)s",
)


def end_now(job_pk: int, *, actor: str, reason: str) -> int:
    """Move the locked job into ``dead_letters`` as cancelled; the dead letter's id. Durable:
    a dead letter is evidence."""
    rows = sql.durable_rows(_END_NOW, {"id": job_pk, "actor": actor, "reason": reason})
    return rows[0][0]


# Record the request on the locked row (primary key). Its handler reads it at its next
# heartbeat (jobs.storage.leases._HEARTBEAT, or _REQUESTED for a loop-fenced one).
_REQUEST = """
UPDATE jobs SET cancel_requested_at = now(), cancel_requested_by = %(actor)s, cancel_reason = %(reason)s
 WHERE id = %(id)s
"""


def request(job_pk: int, *, actor: str, reason: str) -> None:
    sql.durable(_REQUEST, {"id": job_pk, "actor": actor, "reason": reason})


# --- the runner's side ----------------------------------------------------------------

# Is a cancel requested for this held lease (primary key)? For a loop-fenced handler, whose
# heartbeat must not write its job's row. No row: the lease was taken.
_REQUESTED = "SELECT cancel_requested_at IS NOT NULL FROM jobs WHERE id = %s AND lease_token = %s"


def requested(job_pk: int, token: uuid.UUID) -> bool | None:
    """True when a cancel was requested, False when not, None when the lease is gone."""
    with connection.cursor() as cursor:
        cursor.execute(_REQUESTED, [job_pk, token])
        row = cursor.fetchone()
    return row[0] if row else None


_FROM_REQUEST = {
    "describe": "'cancelled by ' || cancel_requested_by || ' while it ran: ' || cancel_reason",
    "actor": "cancel_requested_by",
    "reason": "cancel_reason",
}

# Settle a run whose job carries a request: its handler obeyed it (JobCancelled), or it
# answered a re-queue the reschedule refused. Guarded on the lease token (primary key).
_SETTLE = (
    "WITH gone AS (DELETE FROM jobs WHERE id = %(id)s AND lease_token = %(token)s"
    " AND cancel_requested_at IS NOT NULL RETURNING *)\n" + _LETTER_FROM_GONE.format(**_FROM_REQUEST)
)


def settle_cancelled(job: ClaimedJob) -> bool:
    """End this run as cancelled; False when the lease is gone or no request stands."""
    rows = sql.durable_rows(_SETTLE, {"id": job.id, "token": job.lease_token})
    if not rows:
        return False
    # Counted by the settler (vpay_jobs_total{disposition="cancelled"}).
    _log_ended(rows[0], "while it ran")
    return True


# Waiting jobs that carry a request (index jobs_job_cancel_waiting_idx): runs handed back
# without a settle, or freed by the reaper. SKIP LOCKED: a row a claim is taking is left to
# that run's heartbeat and settle; the outer guard is repeated for the row the DELETE re-reads.
_SWEEP = (
    "WITH gone AS (DELETE FROM jobs WHERE id IN ("
    " SELECT id FROM jobs WHERE locked_at IS NULL AND cancel_requested_at IS NOT NULL"
    " ORDER BY id LIMIT %(page)s FOR UPDATE SKIP LOCKED)"
    " AND locked_at IS NULL RETURNING *)\n" + _LETTER_FROM_GONE.format(**_FROM_REQUEST)
)


def sweep_waiting(page: int = 100) -> int:
    """End waiting jobs that carry a cancel request (each beat, after the reaper)."""
    rows = sql.durable_rows(_SWEEP, {"page": page})
    for row in rows:
        metrics.JOBS.labels(kind=row[2], disposition="cancelled").inc()
        _log_ended(row, "after its run was handed back")
    return len(rows)


def _log_ended(row: tuple, when: str) -> None:
    letter_id, job_id, kind = row
    logger.info("job cancelled " + when, extra={"job_id": str(job_id), "kind": kind, "dead_letter_id": letter_id})


def note_overtaken(job: ClaimedJob, requested_by: str, reason: str) -> None:
    """A finish deleted a job whose cancel request its handler never saw (it did not
    heartbeat after the request): its answer stands. The job's row, which held who asked
    and why, is gone, so this line is the request's record."""
    logger.warning(
        "cancel request overtaken: the job finished before it saw the request; its answer stands",
        extra={
            "job_id": str(job.job_id),
            "kind": job.kind,
            "cancel_requested_by": requested_by,
            "cancel_reason": reason[:500],
        },
    )
