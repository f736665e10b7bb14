"""The reaper: one statement that rescues every job of dead workers (crash attribution,
``jobs.leases``), and buries a checkpointing job that keeps crashing without progress.

**Recovery cap.** A job holding a checkpoint (``jobs.checkpoints``) is an iteration the
runner can measure: ``recoveries`` counts the rescues since its cursor last moved (the
heartbeat that moves it resets the count). A rescue that would take the count past
``VPAY_JOB_RECOVERY_CAP`` dead-letters the job as ``no_progress`` instead of handing it out
again: whatever kills its workers sits between its cursor and the next one, and only a
human can move it. A job without a checkpoint has no progress to measure; its attempts
bound it (``crashed_worker``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from jobs import sql
from jobs.models import LAST_ERROR_MAX, DeadLetterCause
from jobs.repository import (
    ALERT_FOR_LETTERS,
    DEAD_LETTER_COLUMNS,
    LETTER_RETURNING,
    NOTIFY_ALERT_JOBS,
    alert_job_params,
)

# A worker with one expired lease is dead (its heartbeat extends all of them together):
# every job it still holds is rescued in this one statement (index jobs_job_locked_by_idx),
# so the count of what it held is whole. Per job, by `together` (what its worker held):
# stalled (`recoveries` already at the cap) -> dead letter `no_progress`;
# alone, on its last attempt -> dead letter `crashed_worker`; alone otherwise -> back to the
# queue, attempt spent; beside others -> back, attempt refunded, crashes + 1 (a suspect).
# Every rescue of a job with a checkpoint counts `recoveries + 1`.
REAP = f"""
WITH dead_workers AS (
    SELECT DISTINCT locked_by FROM jobs
     WHERE locked_at IS NOT NULL AND lease_expires_at < now()
),
held AS (
    SELECT j.id, j.locked_by, j.attempts >= j.max_attempts AS last_attempt,
           (SELECT count(*) FROM jobs o WHERE o.locked_by = j.locked_by AND o.locked_at IS NOT NULL) AS together,
           j.recoveries >= %(recovery_cap)s AS stalled  -- counted only while a checkpoint is held
      FROM jobs j
     WHERE j.locked_at IS NOT NULL AND j.locked_by IN (SELECT locked_by FROM dead_workers)
     FOR UPDATE OF j SKIP LOCKED
),
dead AS (
    DELETE FROM jobs j USING held h
     WHERE j.id = h.id AND (h.stalled OR (h.together = 1 AND h.last_attempt))
    RETURNING j.*, h.stalled
),
buried AS (
    INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS})
    SELECT job_id, kind, queue, payload, priority, tenant, correlation_id, attempts, max_attempts,
           CASE WHEN stalled THEN '{DeadLetterCause.NO_PROGRESS.value}'
                ELSE '{DeadLetterCause.CRASHED_WORKER.value}' END,
           'transient',
           left(CASE WHEN stalled
                     THEN 'its workers died ' || (recoveries + 1) || ' times since its checkpoint last moved'
                          || ' (recovery cap ' || %(recovery_cap)s || '); it stopped at ' || checkpoint::text
                     ELSE 'its worker (' || locked_by || ') died running only this job, on its last attempt'
                END, {LAST_ERROR_MAX}),
           created_at, dedupe_key
      FROM dead
    RETURNING {LETTER_RETURNING}
),
{ALERT_FOR_LETTERS.format(letters="buried")},
freed AS (
    UPDATE jobs j
       SET last_error = left(CASE WHEN h.together = 1
                                  THEN 'its worker (' || j.locked_by || ') died running only this job'
                                  ELSE 'its worker (' || j.locked_by || ') died holding ' || h.together
                                       || ' jobs; attempt refunded, runs alone next'
                             END, {LAST_ERROR_MAX}),
           attempts = CASE WHEN h.together = 1 THEN j.attempts ELSE greatest(j.attempts - 1, 0) END,
           crashes = CASE WHEN h.together = 1 THEN j.crashes ELSE j.crashes + 1 END,
           recoveries = CASE WHEN j.checkpoint IS NULL THEN j.recoveries ELSE j.recoveries + 1 END,
           locked_by = NULL, lease_token = NULL, locked_at = NULL, lease_expires_at = NULL,
           heartbeat_at = NULL
      FROM held h
     WHERE j.id = h.id AND NOT (h.stalled OR (h.together = 1 AND h.last_attempt))
    RETURNING j.id, h.together > 1 AS suspect
)
SELECT (SELECT count(*) FROM freed), (SELECT count(*) FROM buried),
       (SELECT count(*) FROM buried WHERE kind = 'send_alert'), (SELECT count(*) FROM freed WHERE suspect),
       {NOTIFY_ALERT_JOBS}
"""


@dataclass(frozen=True, slots=True)
class Reaped:
    released: int
    dead_lettered: int
    unalerted: int  # of the dead letters, send_alert jobs (which raise no alert of their own)
    suspects: int  # of the released, those whose attempt was refunded (held beside others)


def recovery_cap() -> int:
    """Rescues a checkpointing job may have since its cursor last moved (``VPAY_JOB_RECOVERY_CAP``)."""
    return int(settings.VPAY_JOB_RECOVERY_CAP)


def reap_expired_leases() -> Reaped:
    """Rescue the jobs of dead workers; see :data:`REAP`. Durable: it writes dead letters."""
    rows = sql.durable(REAP, {**alert_job_params(), "recovery_cap": recovery_cap()})
    freed, buried, unalerted, suspects, _ = rows[0]
    return Reaped(freed, buried, unalerted, suspects)
