"""The reaper: one statement that rescues every job of dead workers (crash attribution,
``jobs.storage.leases``), and buries a checkpointing job that keeps crashing without progress.

**Recovery cap.** A job holding a checkpoint (``jobs.primitives.checkpoints``) is an iteration the
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

from jobs.maintenance.liveness import LATE_BEAT_MARGIN_SECONDS, MAY_JUDGE
from jobs.models import LAST_ERROR_MAX, DeadLetterCause
from jobs.storage import sql
from jobs.storage.repository import (
    ALERT_FOR_LETTERS,
    DEAD_LETTER_COLUMNS,
    LETTER_RETURNING,
    NOTIFY_ALERT_JOBS,
    NOTIFY_CHANNEL,
    alert_job_params,
)

# Who is dead is read from each worker's own beat on the database clock, never from a job's
# lapsed lease (a handler holding its row, a beat skipped, an outage: none is a death):
# `stale` is a `workers` row whose heartbeat is older than that worker's own lease, locked
# SKIP LOCKED so the staleness is judged again on the row's latest version (a beat landing
# meanwhile either holds the row, and it is skipped, or has committed, and it no longer
# matches). A holder with no row at all (pruned, or a step-method test that never beats) is
# judged by its leases: one expired lease and all it holds is rescued. The reaper judges
# nobody until it may (jobs.maintenance.liveness.MAY_JUDGE: on time for a whole lease, its own last beat
# on time too), and never itself. `%(judge)s` is NULL for a caller that does not beat. A
# supervisor naming a child it saw die (`%(dead)s`) rescues that worker's jobs and judges
# nobody else: it does not beat, and just after an outage every live worker's beat would
# look as old as the outage.
# Then every job of a dead worker is rescued in this one statement (index
# jobs_job_locked_by_idx), so the count of what it held is whole. Per job, by `together`
# (what its worker held): stalled (`recoveries` already at the cap) -> dead letter
# `no_progress`; alone, on its last attempt -> dead letter `crashed_worker`; alone
# otherwise -> back to the queue, attempt spent; beside others -> back, attempt refunded,
# crashes + 1 (a suspect). Every rescue of a job with a checkpoint counts `recoveries + 1`.
REAP = f"""
WITH judge AS (SELECT %(dead)s::text IS NULL AND {MAY_JUDGE} AS ready),
stale AS (
    SELECT w.id FROM workers w, judge
     WHERE judge.ready AND w.heartbeat_at < now() - make_interval(secs => w.lease_seconds)
       AND w.id IS DISTINCT FROM %(judge)s
       FOR UPDATE OF w SKIP LOCKED
),
rowless AS (
    SELECT DISTINCT j.locked_by FROM jobs j, judge
     WHERE judge.ready AND j.locked_at IS NOT NULL AND j.lease_expires_at < now()
       AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = j.locked_by)
),
dead_workers AS (
    SELECT id AS locked_by FROM stale UNION SELECT locked_by FROM rowless
    -- a worker process its supervisor saw die (jobs.runner.supervisor): dead for certain, now
    UNION SELECT %(dead)s::text WHERE %(dead)s::text IS NOT NULL
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
    RETURNING j.id, j.queue, h.together > 1 AS suspect
)
SELECT (SELECT count(*) FROM freed), (SELECT count(*) FROM buried),
       (SELECT count(*) FROM buried WHERE kind = 'send_alert'), (SELECT count(*) FROM freed WHERE suspect),
       {NOTIFY_ALERT_JOBS},
       -- the rescued are due now: wake the idle workers of their queues (at commit)
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', q)) FROM (SELECT DISTINCT queue AS q FROM freed) n)
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


def reap_expired_leases(reaper: str | None = None, *, dead: str | None = None) -> Reaped:
    """Rescue the jobs of dead workers; see :data:`REAP`. ``reaper`` is the calling worker's
    id when it beats (it then judges nobody until it has beaten on time for a lease); None
    for a caller that does not beat. ``dead``: a worker known to be dead (its supervisor
    reaped its process), rescued now whatever its beat's age. Durable: it writes dead letters."""
    rows = sql.durable_rows(
        REAP,
        {
            **alert_job_params(),
            "recovery_cap": recovery_cap(),
            "judge": reaper,
            "margin": LATE_BEAT_MARGIN_SECONDS,
            "dead": dead,
        },
    )
    freed, buried, unalerted, suspects, _, _ = rows[0]
    return Reaped(freed, buried, unalerted, suspects)
