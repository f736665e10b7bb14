"""The SQL for jobs held by another job's run: named waiting jobs whose work a running
handler does alongside its own (``jobs.adapters.postgres.hold_waiting``), then finishes or
reschedules as if each had run (``jobs.adapters.postgres.settle_held``).

A held job is not leased and its ``attempts`` are not counted: nothing of it runs. It only
waits longer (``run_at`` moved to the end of the hold), so if the holder dies, the held job
runs on its own when the hold ends and finds what the holder left (webhook deliveries:
an expired attempt lease, recovered by the usual path)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from jobs.storage.pull_forward_sql import text_array
from jobs.storage.repository import NOTIFY_CHANNEL
from vpay.pipelined import fetch_prepared
from vpay.prepared import execute_prepared

# Hold: the named jobs that are waiting (not leased, no cancel asked for, no crash of their
# own to be judged alone) and due by now, in the order given, moved to now() + the hold. Rows
# another transaction is writing are passed over (SKIP LOCKED), as is a job that is running:
# the caller does the work only of the names returned. Each name is one probe of
# jobs_job_dedupe_key_unique. Asked once per carried batch. One row: the names held,
# as a JSON array in the order given, and the instant they were held until (the same for
# all: now() is the transaction's), as text, which the settle matches. Planned generic
# (vpay.pipelined.fetch_prepared): by an array of names, it was planned again at every call.
_HOLD = """
WITH candidate AS (
    SELECT j.id, k.n FROM jobs j JOIN unnest(%(names)s::text[]) WITH ORDINALITY AS k(name, n) ON j.dedupe_key = k.name
     WHERE j.locked_at IS NULL AND j.cancel_requested_at IS NULL AND j.crashes = 0
       AND j.run_at <= now() + make_interval(secs => %(due_within)s::float8)
     ORDER BY k.n
       FOR UPDATE OF j SKIP LOCKED
), held AS (
    UPDATE jobs SET run_at = now() + make_interval(secs => %(hold)s::float8)
      FROM candidate WHERE jobs.id = candidate.id
    RETURNING jobs.dedupe_key, candidate.n
)
SELECT COALESCE((SELECT json_agg(dedupe_key ORDER BY n) FROM held)::text, '[]'),
       (now() + make_interval(secs => %(hold)s::float8))::text
"""


def hold_waiting(dedupe_keys: Sequence[str], due_within: float, hold_seconds: float) -> tuple[list[str], str]:
    params = {"names": list(dedupe_keys), "due_within": float(due_within), "hold": float(hold_seconds)}
    ((names, until),) = fetch_prepared(_HOLD, params, generic=True)
    return json.loads(names), until


# Settle: each held job (still waiting with the run_at its hold gave it: a job that has run on
# its own since, or was moved, is left to itself) either finished (deleted: a held job is never fenced, so it
# has no processed_jobs row to write) or moved to run after its delay from now, its
# attempts and deferrals reset as a run that made progress resets them. By
# jobs_job_dedupe_key_unique. NOTIFY for one due at once. One row: how many were settled.
_SETTLE = f"""
WITH asked AS (
    SELECT * FROM unnest(%s::text[], %s::float8[]) AS a(name, delay)
), finished AS (
    DELETE FROM jobs j USING asked a
     WHERE j.dedupe_key = a.name AND a.delay IS NULL AND j.locked_at IS NULL AND j.run_at = %s::timestamptz
    RETURNING j.id
), moved AS (
    UPDATE jobs j SET run_at = now() + make_interval(secs => a.delay), attempts = 0, deferrals = 0
      FROM asked a
     WHERE j.dedupe_key = a.name AND a.delay IS NOT NULL AND j.locked_at IS NULL AND j.run_at = %s::timestamptz
    RETURNING j.queue, a.delay <= 0 AS due
)
SELECT (SELECT count(*) FROM finished) + (SELECT count(*) FROM moved),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM moved WHERE due)
"""


def settle_held(settles: Sequence[tuple[str, float | None]], held_until: str) -> int:
    delays = "{" + ",".join("NULL" if d is None else repr(float(d)) for _, d in settles) + "}"
    row = execute_prepared(_SETTLE, [text_array([name for name, _ in settles]), delays, held_until, held_until])
    return int(row[0]) if row else 0
