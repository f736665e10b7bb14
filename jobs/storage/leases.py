"""Leases: the claim, the heartbeats that keep leases alive, hand-backs, and the reaper.

A worker claims only what its executors start at once (jobs.runner.worker), so a lease is held
by a running handler, or for the milliseconds between the claim and the start. While a
worker lives its heartbeat (``worker_heartbeat``, on its own thread and connection)
extends every lease it holds, on the database clock; a running handler's lease never
lapses under a live worker, whatever its kind's timeout. When the heartbeat stops, the
leases run out about two heartbeat periods later and any worker's reaper rescues them.

**Crash attribution.** The reaper rescues all of a dead worker's jobs at once and decides
whose attempt the crash spends:

* the worker held only this job: the crash is pinned on it. Its attempt stays spent and,
  on its last one, it is dead-lettered as ``crashed_worker``;
* the worker held several: nobody can say which killed it. Each one's attempt is refunded
  and its ``crashes`` counted: it becomes a *suspect*, claimed only by a worker running
  nothing else, which then runs nothing else beside it (``claim_suspect``). A second
  crash is pinned on it alone. A suspect that settles (finish, retry, reschedule) is
  cleared: its row is deleted, or ``crashes`` is reset.

So a job that kills its worker spends only its own attempts, and one that ran beside it
spends none of its own on that crash.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from jobs.storage import sql
from jobs.storage.repository import NOTIFY_CHANNEL, bounded


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: int
    job_id: uuid.UUID
    kind: str
    queue: str
    payload: dict = field(repr=False)  # application data: kept out of reprs and logs
    attempts: int
    max_attempts: int
    deferrals: int
    lease_token: uuid.UUID
    lease_seconds: float
    tenant: str
    correlation_id: str
    # A fence row for this job_id existed when it was claimed: its effect already happened.
    processed: bool = False
    # It was rescued from a worker that died holding it among others (jobs.crashes > 0):
    # it runs alone, so that a second crash is pinned on it or on nothing.
    suspect: bool = False
    # Seconds since workers first could not run it (jobs.unrunnable_since), on the database
    # clock; None if none ever failed to.
    unrunnable_for: float | None = None


# What every claim writes on the rows it takes (a fresh token, the lease from now() on the
# database clock, the attempt starting), and what it returns of them: shared by CLAIM and
# CLAIM_SUSPECT, which differ only in how they choose the rows. The processed flag is a scalar
# subquery, not EXISTS: the planner turns a correlated EXISTS here into a hashed scan of all
# of processed_jobs (days of rows); this is one primary-key probe per row.
_TAKE_LEASE = """   SET locked_by = %(worker)s,
       lease_token = gen_random_uuid(),
       locked_at = now(),
       heartbeat_at = now(),
       lease_expires_at = now() + make_interval(secs => coalesce(%(lease)s, (%(leases)s::jsonb ->> j.kind)::float8, %(default_lease)s)),
       attempts = j.attempts + 1"""
_CLAIMED = """j.id, j.job_id, j.kind, j.queue, j.payload, j.attempts, j.max_attempts, j.deferrals,
          j.lease_token, extract(epoch FROM j.lease_expires_at - j.locked_at)::float8,
          j.tenant, j.correlation_id"""
_PROCESSED = "coalesce((SELECT true FROM processed_jobs p WHERE p.job_id = j.job_id), false)"
_UNRUNNABLE_FOR = "extract(epoch FROM now() - j.unrunnable_since)::float8"

# Fair claim, one statement. `tenants` walks the distinct tenants that have claimable work
# (a skip-scan over jobs_job_ready_idx: one index probe per tenant), starting after the
# caller's rotating cursor and, past the last tenant, wrapping once to the first and on up to
# the cursor, at most %(max_tenants)s of them (without the wrap a claim after the cursor came
# up short while the tenants before it had work). Each tenant then
# contributes its oldest rows by (priority, run_at), an even share of the batch, locked with
# SKIP LOCKED; the batch interleaves them by rank within tenant, then by walk position, and
# the cursor moves past the furthest tenant served (round-robin even at batch size 1). A tenant with a 300k
# backlog therefore gets one slot in each round, like everyone else, and no claim touches
# more than max_tenants * share rows. A worker claims only for executors that start the
# job now, so attempts is counted here, by the claim, as the attempt starting; a job that
# kills its worker has already counted up. Suspects (crashes > 0) are left to claim_suspect.
# Only the kinds the worker has handlers for (`kinds`): during a rolling deploy an older
# worker leaves a newer release's kinds for the newer workers, no attempt spent (a kind no
# worker claims for long is reported: jobs.maintenance.unclaimable). `skip`: jobs this worker found it
# cannot run a moment ago (a newer task path), left to the others for a while (jobs.runner.dispatch).
# Never a job whose cancel was requested while it ran and that is free again (rescued from a
# dead worker, handed back): the cancel sweep ends it (jobs.primitives.cancels); the rescue's NOTIFY
# would otherwise let a claim run it again in the moment before the sweep.
# Jobs due beyond the parking horizon are not in jobs_job_ready_idx (NOT j.parked, which
# every scan here repeats so the planner may use that partial index): a tenant's scan steps
# over its not-yet-due rows only as far as the horizon (jobs.storage.parking).
# The kinds are not in jobs_job_ready_idx: an older worker steps over a tenant's backlog of a
# kind it lacks row by row, on every claim, for as long as the deploy lasts (cost not yet
# measured with a large such backlog; an index led by kind would remove it).
# The lease expiry is written from now(): any reaper, on any host, honours the claimant's
# lease as Postgres measures it.
# Planned once per connection (generic): planned for its parameters, the claim cost more to
# plan than to run once the queue held a backlog (0.6 ms of planning for 0.3 of execution at
# 6,000 due jobs, 2.1 for 1.0 at 100,000), and plan_cache_mode auto chose to plan it at
# nearly every call. The rows taken are updated by primary key from an array (jobs_pkey),
# not joined to `chosen`: a generic plan prices `LIMIT %(batch)s` at a tenth of its input,
# and joined it read all of jobs into a hash for four rows (2.7 ms at 6,000 due jobs; 0.25
# now, 0.45 at 100,000: bench/WEBHOOKS.md).
CLAIM = f"""
WITH RECURSIVE tenants(tenant, n, wrapped) AS (
    (SELECT t.tenant, 1, t.wrapped FROM (
        (SELECT j.tenant, false AS wrapped FROM jobs j
          WHERE j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now() AND j.queue = ANY(%(queues)s) AND j.kind = ANY(%(kinds)s)
            AND j.tenant > %(after)s
          ORDER BY j.tenant LIMIT 1)
        UNION ALL
        (SELECT j.tenant, true FROM jobs j
          WHERE j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now() AND j.queue = ANY(%(queues)s) AND j.kind = ANY(%(kinds)s)
          ORDER BY j.tenant LIMIT 1)
     ) t LIMIT 1)
  UNION ALL
    SELECT nxt.tenant, tenants.n + 1, nxt.wrapped FROM tenants, LATERAL (
        (SELECT j.tenant, tenants.wrapped AS wrapped FROM jobs j
          WHERE j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now() AND j.queue = ANY(%(queues)s) AND j.kind = ANY(%(kinds)s)
            AND j.tenant > tenants.tenant AND (NOT tenants.wrapped OR j.tenant <= %(after)s)
          ORDER BY j.tenant LIMIT 1)
        UNION ALL
        -- past the last tenant: wrap once to the first, up to where this walk began
        (SELECT j.tenant, true FROM jobs j
          WHERE j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now() AND j.queue = ANY(%(queues)s) AND j.kind = ANY(%(kinds)s)
            AND NOT tenants.wrapped AND j.tenant <= %(after)s
          ORDER BY j.tenant LIMIT 1)
        LIMIT 1) nxt
     WHERE tenants.n < %(max_tenants)s
),
share AS (SELECT ceil(%(batch)s::numeric / count(*))::int AS k FROM tenants),
locked AS (
    SELECT c.*, tenants.n FROM tenants, LATERAL (
        SELECT j.id, j.tenant, j.priority, j.run_at FROM jobs j
         WHERE j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now() AND j.queue = ANY(%(queues)s) AND j.kind = ANY(%(kinds)s)
           AND j.tenant = tenants.tenant AND j.crashes = 0 AND j.id <> ALL(%(skip)s)
           AND j.cancel_requested_at IS NULL
         ORDER BY j.priority, j.run_at
         LIMIT (SELECT k FROM share)
         FOR UPDATE SKIP LOCKED) c
),
chosen AS (
    SELECT id, tenant, n FROM (
        SELECT id, tenant, n, priority,
               row_number() OVER (PARTITION BY tenant ORDER BY priority, run_at) AS rank
          FROM locked) r
     ORDER BY priority, rank, n
     LIMIT %(batch)s
)
UPDATE jobs j
{_TAKE_LEASE}
 WHERE j.id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING {_CLAIMED},
          (SELECT tenant FROM chosen ORDER BY n DESC LIMIT 1),
          {_PROCESSED}, {_UNRUNNABLE_FOR}
"""


@dataclass(frozen=True, slots=True)
class ClaimResult:
    jobs: list[ClaimedJob]
    # Where the next claim's tenant walk starts, so many tenants are served round-robin.
    next_after: str


def claim(
    *,
    worker: str,
    queues: Sequence[str],
    kinds: Sequence[str],
    batch: int,
    lease_seconds: float | None,
    kind_leases: dict[str, float],
    default_lease: float,
    after: str,
    max_tenants: int,
    skip: Sequence[int] = (),
) -> ClaimResult:
    """Claim up to ``batch`` jobs for ``worker``; see :data:`CLAIM`."""
    rows = sql.bookkeeping_rows(
        CLAIM,
        {
            "worker": worker,
            "queues": list(queues),
            "kinds": list(kinds),
            "batch": batch,
            "lease": lease_seconds,
            "leases": json.dumps(kind_leases),
            "default_lease": default_lease,
            "after": after,
            "max_tenants": max_tenants,
            "skip": list(skip),
        },
        prepared=True,
        generic=True,
    )
    if not rows:
        return ClaimResult([], "")
    # The next claim's walk starts after the furthest tenant this one served, so tenants
    # beyond a batch's reach (or max_tenants') get their turn next, round-robin.
    next_after = rows[0][12]
    return ClaimResult([_claimed(r) for r in rows], next_after)


def _claimed(r: tuple) -> ClaimedJob:
    return ClaimedJob(
        id=r[0],
        job_id=r[1],
        kind=r[2],
        queue=r[3],
        payload=r[4] if isinstance(r[4], dict) else json.loads(r[4]) if isinstance(r[4], str) else r[4],
        attempts=r[5],
        max_attempts=r[6],
        deferrals=r[7],
        lease_token=r[8],
        lease_seconds=r[9],
        tenant=r[10],
        correlation_id=r[11],
        processed=r[13],
        unrunnable_for=r[14],
    )


# The oldest due suspect, for a worker running nothing else (index jobs_job_suspect_idx).
CLAIM_SUSPECT = f"""
UPDATE jobs j
{_TAKE_LEASE}
  FROM (SELECT id FROM jobs
         WHERE locked_at IS NULL AND crashes > 0 AND run_at <= now() AND queue = ANY(%(queues)s)
           AND kind = ANY(%(kinds)s) AND cancel_requested_at IS NULL
         ORDER BY run_at LIMIT 1
         FOR UPDATE SKIP LOCKED) s
 WHERE j.id = s.id
RETURNING {_CLAIMED}, '',
          {_PROCESSED}, {_UNRUNNABLE_FOR}
"""


def claim_suspect(
    *,
    worker: str,
    queues: Sequence[str],
    kinds: Sequence[str],
    lease_seconds: float | None,
    kind_leases: dict[str, float],
    default_lease: float,
) -> ClaimedJob | None:
    """Claim the oldest due suspect, to run alone; see the module docstring."""
    rows = sql.bookkeeping_rows(
        CLAIM_SUSPECT,
        {
            "worker": worker,
            "queues": list(queues),
            "kinds": list(kinds),
            "lease": lease_seconds,
            "leases": json.dumps(kind_leases),
            "default_lease": default_lease,
        },
    )
    if not rows:
        return None
    job = _claimed(rows[0])
    return dataclasses.replace(job, suspect=True)


# Is a suspect due (index jobs_job_suspect_idx)? Asked by the maintenance thread, so the
# dispatcher's claim stays one statement.
_SUSPECT_WAITING = """
SELECT EXISTS (SELECT 1 FROM jobs WHERE locked_at IS NULL AND crashes > 0 AND run_at <= now() AND queue = ANY(%s)
                 AND kind = ANY(%s) AND cancel_requested_at IS NULL)
"""


def suspect_waiting(queues: Sequence[str], kinds: Sequence[str]) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_SUSPECT_WAITING, [list(queues), list(kinds)])
        return bool(cursor.fetchone()[0])


# --- a job's heartbeat -------------------------------------------------------------------

# One job's heartbeat (JobContext.heartbeat): its lease extended from now, guarded on the
# claim's token (primary key); it also says whether an operator asked to cancel (jobs.primitives.cancels).
# With a checkpoint (JobContext.checkpoint) the cursor rides in the same statement, so a
# stored cursor always belongs to a live lease; a cursor that moved resets `recoveries`
# (SET reads the old row, so `checkpoint` on the right is the previous cursor).
_HEARTBEAT = """
UPDATE jobs SET heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => %(lease)s),
       checkpoint = CASE WHEN %(write)s THEN %(cursor)s::jsonb ELSE checkpoint END,
       recoveries = CASE WHEN %(write)s AND checkpoint IS DISTINCT FROM %(cursor)s::jsonb THEN 0
                         ELSE recoveries END
 WHERE id = %(id)s AND lease_token = %(token)s
RETURNING cancel_requested_at IS NOT NULL
"""

_UNCHANGED = object()


def heartbeat(job_id: int, token: uuid.UUID, lease_seconds: float, checkpoint: object = _UNCHANGED) -> bool | None:
    """Extend a held lease by ``lease_seconds`` from now, storing ``checkpoint`` (a JSON
    text, or None to clear it) when given. None when the lease was already taken, else
    whether a cancel has been requested."""
    write = checkpoint is not _UNCHANGED
    params: dict[str, Any] = {
        "lease": lease_seconds,
        "write": write,
        "cursor": checkpoint if write else None,
        "id": job_id,
    }
    with connection.cursor() as cursor:
        cursor.execute(_HEARTBEAT, {**params, "token": token})
        row = cursor.fetchone()
        return row[0] if row else None


# --- hand-backs -----------------------------------------------------------------------

# Give leases back, due at once (primary key), and wake the idle workers of their queues
# (delivered at commit): handed-back work must not wait out another worker's idle poll.
# `refund` undoes the claim's attempt for jobs that never started, or whose attempt ended
# for a reason not theirs (the database went away).
_RELEASE = f"""
WITH freed AS (
    UPDATE jobs j
       SET locked_by = NULL, lease_token = NULL, locked_at = NULL, lease_expires_at = NULL,
           heartbeat_at = NULL, run_at = least(j.run_at, now()),
           attempts = CASE WHEN %s THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
           last_error = CASE WHEN %s = '' THEN j.last_error ELSE %s END
      FROM unnest(%s::bigint[], %s::uuid[]) AS s(id, token)
     WHERE j.id = s.id AND j.lease_token = s.token
    RETURNING j.queue
)
SELECT count(*), (SELECT count(pg_notify('{NOTIFY_CHANNEL}', q)) FROM (SELECT DISTINCT queue AS q FROM freed) n)
  FROM freed
"""


def release(leases: Iterable[tuple[int, uuid.UUID]], *, refund: bool, error: str = "") -> int:
    """Hand these leases back (guarded on their tokens); returns how many still matched."""
    leases = list(leases)
    if not leases:
        return 0
    error = bounded(error)
    rows = sql.bookkeeping_rows(_RELEASE, [refund, error, error, [i for i, _ in leases], [t for _, t in leases]])
    return int(rows[0][0])


# The reaper (REAP, reap_expired_leases) is in jobs/maintenance/reaper.py.
