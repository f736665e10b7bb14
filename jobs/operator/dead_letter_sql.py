"""The SQL of operators' actions on dead letters: replay, discard, and the reads behind
them (``jobs.services.dead_letters``, the admin, ``deadletters``); a job's cancel is in
``jobs.primitives.cancels``. Every age and horizon is computed by PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection

from jobs.storage.repository import NOTIFY_CHANNEL

# What an operator's action needs to know about each dead letter, read in one statement.
# `past_horizon`: the fence row of this job_id's effect, if the effect ever happened, may
# have expired. It was written after the job's first enqueue (the earliest job_created_at
# among every dead letter of this job_id: a replayed job that dead-letters again starts a
# new row with a later job_created_at), so it lives at least until that instant plus the
# TTL; with less than `margin` left of that, a replay might run after the row is gone and
# apply the effect a second time. A fence row that is still there for long enough settles
# it the other way: the effect happened, and the replay will be skipped as a duplicate.
_LETTER_STATUS = """
SELECT d.id, d.state, d.kind, d.job_id, d.cause,
       (SELECT min(o.job_created_at) FROM dead_letters o WHERE o.job_id = d.job_id)
         + make_interval(secs => %(ttl)s) <= now() + make_interval(secs => %(margin)s)
       AND NOT EXISTS (SELECT 1 FROM processed_jobs p WHERE p.job_id = d.job_id
                          AND p.expires_at > now() + make_interval(secs => %(margin)s)) AS past_horizon,
       EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = d.job_id) AS job_live,
       d.dedupe_key IS NOT NULL AND EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = d.dedupe_key) AS key_live
  FROM dead_letters d
 WHERE d.id = ANY(%(ids)s)
 ORDER BY d.id
"""


@dataclass(frozen=True, slots=True)
class LetterStatus:
    id: int
    state: str
    kind: str
    job_id: uuid.UUID
    cause: str
    past_horizon: bool
    job_live: bool
    key_live: bool


def letter_status(
    ids: Sequence[int], *, ttl_seconds: float, margin_seconds: float, lock: bool = False
) -> list[LetterStatus]:
    """The replay-relevant status of these dead letters; ``lock`` takes their row locks
    (``FOR UPDATE``), so the caller's transaction decides on a state nobody else changes."""
    sql = _LETTER_STATUS + (" FOR UPDATE OF d" if lock else "")
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": list(ids), "ttl": ttl_seconds, "margin": margin_seconds})
        return [LetterStatus(*row) for row in cursor.fetchall()]


# Re-enqueue a dead letter with its own job_id (and dedupe key), and mark it replayed, in
# one statement of the caller's transaction. The mark depends on the insert: when a live
# job already holds the job_id or the dedupe key, nothing is written at all. The state
# compare-and-swap makes a second replay (or a replay of a discarded letter) match nothing.
_REPLAY = f"""
WITH ins AS (
    INSERT INTO jobs (job_id, kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id, tenant)
    SELECT job_id, kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id, tenant
      FROM dead_letters WHERE id = %(id)s AND state = 'pending_review'
    ON CONFLICT DO NOTHING
    RETURNING id, queue
),
marked AS (
    UPDATE dead_letters
       SET state = 'replayed', replayed_by = %(actor)s, replayed_at = now(), replay_forced = %(forced)s
     WHERE id = %(id)s AND state = 'pending_review' AND EXISTS (SELECT 1 FROM ins)
    RETURNING id
)
SELECT (SELECT id FROM ins), (SELECT count(*) FROM marked),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM ins)
"""


def replay_dead_letter(letter_id: int, *, actor: str, forced: bool) -> int | None:
    """Re-enqueue the pending dead letter and mark it replayed; the new job row's id, or None
    when nothing was written (not pending, or its job_id or dedupe key is live)."""
    with connection.cursor() as cursor:
        cursor.execute(_REPLAY, {"id": letter_id, "actor": actor, "forced": forced})
        job_pk, marked, _ = cursor.fetchone()
    if job_pk is not None and marked != 1:  # cannot happen under the caller's row lock
        raise RuntimeError(f"dead letter {letter_id}: job inserted but state not swapped")
    return job_pk


_DISCARD = """
UPDATE dead_letters
   SET state = 'discarded', discarded_by = %(actor)s, discarded_at = now(), discard_reason = %(reason)s
 WHERE id = %(id)s AND state = 'pending_review'
RETURNING id
"""


def discard_dead_letter(letter_id: int, *, actor: str, reason: str) -> bool:
    """Compare-and-swap ``pending_review → discarded``; False when it was not pending."""
    with connection.cursor() as cursor:
        cursor.execute(_DISCARD, {"id": letter_id, "actor": actor, "reason": reason})
        return cursor.fetchone() is not None


# The shell's selection (manage.py deadletters): filters, newest first, bounded.
_SELECT_LETTERS = """
SELECT d.id, d.state, d.kind, d.queue, d.cause, d.attempts, d.correlation_id,
       extract(epoch FROM now() - d.created_at)::float8 AS age, left(d.last_error, %(excerpt)s)
  FROM dead_letters d
 WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s))
   AND (%(states)s::text[] IS NULL OR d.state = ANY(%(states)s))
   AND (%(kinds)s::text[] IS NULL OR d.kind = ANY(%(kinds)s))
   AND (%(queues)s::text[] IS NULL OR d.queue = ANY(%(queues)s))
   AND (%(since_seconds)s::float8 IS NULL OR d.created_at >= now() - make_interval(secs => %(since_seconds)s))
   AND (%(since_at)s::timestamptz IS NULL OR d.created_at >= %(since_at)s)
 ORDER BY d.created_at DESC, d.id DESC
 LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class LetterRow:
    id: int
    state: str
    kind: str
    queue: str
    cause: str
    attempts: int
    correlation_id: str
    age_seconds: float
    error_excerpt: str


def select_dead_letters(
    *,
    ids: Sequence[int] | None = None,
    states: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    queues: Sequence[str] | None = None,
    since_seconds: float | None = None,
    since_at=None,
    limit: int = 1000,
    excerpt: int = 80,
) -> list[LetterRow]:
    """Dead letters matching every given filter (None: no filter), newest first."""
    params = {
        "ids": list(ids) if ids else None,
        "states": list(states) if states else None,
        "kinds": list(kinds) if kinds else None,
        "queues": list(queues) if queues else None,
        "since_seconds": since_seconds,
        "since_at": since_at,
        "limit": limit,
        "excerpt": excerpt,
    }
    with connection.cursor() as cursor:
        cursor.execute(_SELECT_LETTERS, params)
        return [LetterRow(*row) for row in cursor.fetchall()]
