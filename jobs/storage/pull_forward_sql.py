"""The SQL that pulls a named job forward: a waiting one made due now, a running one woken
(``jobs.adapters.postgres.pull_forward``, and ``run_again`` for a caller that must not lose the
run); and the first of several waiting names moved, for a freed webhook slot
(``jobs.adapters.postgres.pull_forward_waiting``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from jobs.storage.repository import NOTIFY_CHANNEL
from vpay.prepared import execute_prepared

# The named job (jobs_job_dedupe_key_unique) made due now when it waits more than the floor;
# when it is leased (a floor of 0 only), woken: run_at set after its claim's locked_at (a
# claim takes only rows with run_at <= its now(), so nothing but a wake leaves it there
# while the lease is held, and the microsecond keeps it after even within one transaction),
# and the plain reschedule that settles it makes it due at once (jobs.storage.repository's
# _RESCHEDULE). A row a settle or a claim is writing is waited for, then judged again. Still
# lost: a wake of a job already due, claimed after this statement and before the caller
# commits, reads the caller's write as not yet made (a caller that must not lose it pulls
# forward after its commit). NOTIFY for a moved one. Prepared: a settlement wakes the
# fan-out with it, and planning it each time cost the database more than running it.
_PULL_FORWARD = f"""
WITH moved AS (
    UPDATE jobs SET run_at = CASE WHEN locked_at IS NULL THEN now()
                                  ELSE greatest(now(), locked_at + interval '1 microsecond') END
     WHERE dedupe_key = %s
       AND CASE WHEN locked_at IS NULL THEN run_at > now() + make_interval(secs => %s::float8)
                ELSE %s::float8 <= 0 AND run_at <= locked_at END
    RETURNING queue, locked_at IS NULL AS waiting
)
SELECT count(*), count(pg_notify('{NOTIFY_CHANNEL}', queue)) FILTER (WHERE waiting) FROM moved
"""


def pull_forward(dedupe_key: str, floor_seconds: float) -> bool:
    row = execute_prepared(_PULL_FORWARD, [dedupe_key, float(floor_seconds), float(floor_seconds)])
    return row is not None and int(row[0]) > 0


# The named job made to run after the caller's commit, whatever it is doing
# (jobs_job_dedupe_key_unique): a waiting one due now, even one due already (its run_at moved a
# microsecond earlier, so it keeps its place among its tenant's due jobs, and a held job's
# carrier, whose hold ran out, finds it moved and leaves it, jobs.storage.held_sql), its row
# locked to the caller's commit so no claim (SKIP LOCKED) takes it before the caller's writes
# can be read; a leased one woken, as _PULL_FORWARD wakes it, unless it is woken already. A
# write every call, for callers that are rare and must not lose the run (a resend, a re-enabled
# endpoint, a capture's poll), unlike the fan-out's wakes. NOTIFY for a waiting one, delivered
# at the caller's commit. No row: none of the name, or one woken already, which runs again
# anyway (the caller's enqueue then adds nothing).
_RUN_AGAIN = f"""
WITH moved AS (
    UPDATE jobs SET run_at = CASE WHEN locked_at IS NOT NULL THEN greatest(now(), locked_at + interval '1 microsecond')
                                  WHEN run_at <= now() THEN run_at - interval '1 microsecond'
                                  ELSE now() END
     WHERE dedupe_key = %s AND (locked_at IS NULL OR run_at <= locked_at)
    RETURNING queue, locked_at IS NULL AS waiting
)
SELECT count(*), count(pg_notify('{NOTIFY_CHANNEL}', queue)) FILTER (WHERE waiting) FROM moved
"""


def run_again(dedupe_key: str) -> bool:
    row = execute_prepared(_RUN_AGAIN, [dedupe_key])
    return row is not None and int(row[0]) > 0


# The first ``limit`` of several named jobs (in the order given) that are waiting, not leased
# and due more than the floor from now (and, asked for, deferred since their last settle
# that was not a deferral: ``deferrals > 0``, which a run that made progress resets), made
# due now: one statement for a caller that would
# otherwise try the names one by one (jobs_job_dedupe_key_unique finds each name; SKIP
# LOCKED passes over a row another transaction is moving). Prepared: freed webhook slots ask
# it once per batch of recorded attempts. One row: the names moved, as a JSON array in the
# order given.
_PULL_FORWARD_WAITING = f"""
WITH candidate AS (
    SELECT j.id, k.n FROM jobs j JOIN unnest(%s::text[]) WITH ORDINALITY AS k(name, n) ON j.dedupe_key = k.name
     WHERE j.locked_at IS NULL AND j.run_at > now() + make_interval(secs => %s::float8)
       AND (j.deferrals > 0 OR NOT %s::bool)
     ORDER BY k.n LIMIT %s::int
       FOR UPDATE OF j SKIP LOCKED
), moved AS (
    UPDATE jobs SET run_at = now() FROM candidate WHERE jobs.id = candidate.id
    RETURNING jobs.queue, jobs.dedupe_key, candidate.n
)
SELECT COALESCE((SELECT json_agg(dedupe_key ORDER BY n) FROM moved)::text, '[]'),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM moved)
"""


def text_array(values: Sequence[str]) -> str:
    """``values`` as a PostgreSQL array literal (every element quoted, ``"`` and ``\\`` escaped)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def pull_forward_waiting(dedupe_keys: list[str], limit: int, floor_seconds: float, deferred_only: bool) -> list[str]:
    row = execute_prepared(
        _PULL_FORWARD_WAITING, [text_array(dedupe_keys), float(floor_seconds), bool(deferred_only), int(limit)]
    )
    return json.loads(row[0]) if row else []
