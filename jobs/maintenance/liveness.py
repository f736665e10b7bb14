"""Liveness: the `workers` table. Each worker's beat (its row and the leases it holds), who may
judge others dead and when, pruning the long dead, and the one worker that drains for
suspects. Death is read from a worker's own beat on the database clock, never from a job's
lapsed lease (docs/runner.md, "Liveness"); the reaper's statement is in jobs.maintenance.reaper, a job's
own heartbeat and the claim in jobs.storage.leases."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from jobs.storage import sql

# How late a beat may be before the worker counts as just back (see _WORKER_HEARTBEAT).
LATE_BEAT_MARGIN_SECONDS = 2.0


# May the worker %(judge)s judge others dead? Only once it has beaten on time for a whole lease
# (`alive_since`) and its own last beat is on time too: one just back from an outage (or whose
# first beat since the database returned has not landed yet) would find every live worker's
# beat as old as the outage. NULL: a caller that does not beat (step methods), which may.
# Used by REAP (jobs.maintenance.reaper) and by pruning; `workers` by primary key.
MAY_JUDGE = """(%(judge)s::text IS NULL
     OR EXISTS (SELECT 1 FROM workers r
                 WHERE r.id = %(judge)s AND r.alive_since <= now() - make_interval(secs => r.lease_seconds)
                   AND r.heartbeat_at >= now() - make_interval(secs => r.heartbeat_seconds + %(margin)s)))"""


# Is any job held by another worker whose beat is late (its row's beat older than its period
# plus the margin) or that has no row and an expired lease: work a reaper may yet rescue, for
# a --burst worker that would otherwise exit before it (index jobs_job_locked_by_idx, then
# workers by primary key).
_LATE_HOLDERS = """
SELECT EXISTS (
    SELECT 1 FROM jobs j
     WHERE j.locked_at IS NOT NULL AND j.locked_by <> %(me)s
       AND coalesce((SELECT w.heartbeat_at < now() - make_interval(secs => w.heartbeat_seconds + %(margin)s)
                       FROM workers w WHERE w.id = j.locked_by),
                     j.lease_expires_at < now()))
"""


def late_holders_waiting(me: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_LATE_HOLDERS, {"me": me, "margin": LATE_BEAT_MARGIN_SECONDS})
        return bool(cursor.fetchone()[0])


# --- the suspect drain ------------------------------------------------------------------

# Take (or keep) the role of the one worker that stops claiming until it is idle, so that a
# suspect can run alone on it: granted unless another worker that still beats holds it.
# Two workers deciding at the same instant may both get it (READ COMMITTED): two drain
# instead of one, never the whole fleet. `workers` is small: a sequential scan.
_TAKE_DRAIN = """
UPDATE workers w SET drains_until = now() + make_interval(secs => %(seconds)s)
 WHERE w.id = %(worker)s
   AND NOT EXISTS (SELECT 1 FROM workers o
                    WHERE o.id <> w.id AND o.drains_until > now()
                      AND o.heartbeat_at > now() - make_interval(secs => o.lease_seconds))
RETURNING 1
"""
_DROP_DRAIN = "UPDATE workers SET drains_until = NULL WHERE id = %s AND drains_until IS NOT NULL"


def take_drain(worker: str, seconds: float) -> bool:
    """Whether ``worker`` is (still) the one draining for suspects, for ``seconds`` more."""
    with connection.cursor() as cursor:
        cursor.execute(_TAKE_DRAIN, {"worker": worker, "seconds": seconds})
        return cursor.fetchone() is not None


def drop_drain(worker: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_DROP_DRAIN, [worker])


# --- the worker's beat ------------------------------------------------------------------

# The worker's heartbeat: its `workers` row (created if missing: a row pruned during a long
# outage comes back) and every lease it still holds (index jobs_job_locked_by_idx), extended
# from now(). A beat later than the worker's period plus a margin after its previous one
# (an outage, a stall; a fresh row too) moves `alive_since` to now: its reaper then judges
# nobody for a lease (jobs.maintenance.reaper). The leases are taken in id order and SKIP LOCKED, so the
# beat never waits: a row being settled, handed back or cancelled is that writer's, and a
# multi-row beat that waited could deadlock with a completer deleting rows in another order.
# A skipped lease does not matter for a live worker: death is read from this row, not from
# a lease. Leases rescued meanwhile are no longer locked_by this worker and are left alone.
_WORKER_HEARTBEAT = """
WITH beat AS (
    INSERT INTO workers (id, hostname, pid, concurrency, queues, started_at, heartbeat_at, alive_since,
                         heartbeat_seconds, lease_seconds)
    VALUES (%(worker)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s, now(), now(), now(),
            %(period)s, %(lease)s)
    ON CONFLICT (id) DO UPDATE
       SET heartbeat_at = now(),
           alive_since = CASE WHEN workers.heartbeat_at < now() - make_interval(secs => workers.heartbeat_seconds + %(margin)s)
                              THEN now() ELSE workers.alive_since END,
           heartbeat_seconds = EXCLUDED.heartbeat_seconds, lease_seconds = EXCLUDED.lease_seconds
    RETURNING 1
),
extended AS (
    UPDATE jobs j SET lease_expires_at = now() + make_interval(secs => %(lease)s), heartbeat_at = now()
      FROM (SELECT id FROM jobs WHERE locked_by = %(worker)s AND locked_at IS NOT NULL
             ORDER BY id FOR UPDATE SKIP LOCKED) mine
     WHERE j.id = mine.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM extended), (SELECT count(*) FROM beat)
"""


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    worker: str
    hostname: str
    pid: int
    concurrency: int
    queues: str
    heartbeat_seconds: float = 5.0


def worker_heartbeat(identity: WorkerIdentity, lease_seconds: float) -> int:
    """Beat: the worker's row and every lease it holds, extended by ``lease_seconds`` from
    now. Returns how many leases were extended."""
    rows = sql.bookkeeping_rows(
        _WORKER_HEARTBEAT,
        {
            "worker": identity.worker,
            "hostname": identity.hostname[:255],
            "pid": identity.pid,
            "concurrency": identity.concurrency,
            "queues": identity.queues,
            "period": identity.heartbeat_seconds,
            "lease": lease_seconds,
            "margin": LATE_BEAT_MARGIN_SECONDS,
        },
    )
    return int(rows[0][0])


def worker_deregister(worker: str) -> None:
    """A clean exit: the worker's row goes (it holds no lease any more)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM workers WHERE id = %s", [worker])


# Workers silent for `leases` of their own leases (never the pruner's: workers may beat at
# different periods): dead, and their jobs rescued by REAP meanwhile (a job whose holder has
# no row is judged by its own lease). Only by a pruner that may judge (MAY_JUDGE: one just
# back from a long outage would delete every live worker's row). A small table: a
# sequential scan.
_PRUNE_WORKERS = f"""
DELETE FROM workers w
 WHERE w.heartbeat_at < now() - make_interval(secs => w.lease_seconds * %(leases)s)
   AND w.id IS DISTINCT FROM %(judge)s
   AND {MAY_JUDGE}
"""


def prune_workers(pruner: str | None = None, leases: float = 4) -> int:
    """Delete long-dead workers' rows; ``pruner`` is the calling worker when it beats."""
    with connection.cursor() as cursor:
        cursor.execute(_PRUNE_WORKERS, {"leases": leases, "judge": pruner, "margin": LATE_BEAT_MARGIN_SECONDS})
        return cursor.rowcount
