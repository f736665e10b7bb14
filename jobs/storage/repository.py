"""The queue's SQL for enqueue and settle. The fence's in ``jobs.storage.fence_sql``; leases,
the claim and the reaper in ``jobs.storage.leases``; pulling a named job forward in ``jobs.storage.pull_forward_sql``; health in
``jobs.storage.health_sql``; operators' actions in ``jobs.operator.dead_letter_sql``; alerts in
``jobs.operator.alert_sql``.

All instants are computed by PostgreSQL (``now()``); Python only ever passes *durations*.
Every write that ends or changes a lease is guarded on the claim's ``lease_token``: when it
matches nothing, the lease was reaped and someone else owns the job.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence

from django.conf import settings
from django.db import connection

from jobs.models import LAST_ERROR_MAX
from jobs.storage import sql
from vpay.prepared import execute_prepared

NOTIFY_CHANNEL = "vpay_jobs"


def bounded(text: str) -> str:
    return text if len(text) <= LAST_ERROR_MAX else text[: LAST_ERROR_MAX - 1] + "…"


# --- enqueue --------------------------------------------------------------------------

# A due job's run_at is now(), the transaction's start, the instant the claim compares with
# (so it is due even within its own transaction). A delay counts from the enqueueing
# statement instead: a transaction that stayed open for a while must not shorten it.
_RUN_AT = "(CASE WHEN {delay} > 0 THEN statement_timestamp() ELSE now() END + make_interval(secs => {delay}))"

# One INSERT; its RETURNING calls pg_notify, and a NOTIFY is delivered at commit, so a
# worker wakes only for a job it can see. Only due jobs notify: waking a worker for a job an
# hour out buys nothing. ON CONFLICT only when something can conflict (a dedupe key, or a
# job_id the caller chose, as a replay does): a fresh random job_id cannot, and skipping the
# speculative insertion is measurably cheaper.
_INSERT_ONE = f"""
INSERT INTO jobs (job_id, kind, queue, payload, priority, run_at, max_attempts,
                  dedupe_key, correlation_id, tenant)
VALUES (%s, %s, %s, %s::jsonb, %s, {_RUN_AT.format(delay="%s::float8")}, %s, %s, %s, %s)
{{on_conflict}}
RETURNING id, CASE WHEN %s THEN pg_notify('{NOTIFY_CHANNEL}', queue) END
"""
_INSERT_ONE_FRESH = _INSERT_ONE.format(on_conflict="")
_INSERT_ONE_MAY_CONFLICT = _INSERT_ONE.format(on_conflict="ON CONFLICT DO NOTHING")


def insert_job(row: tuple, *, may_conflict: bool = True) -> int | None:
    """Insert one job; its ``id``, or ``None`` when its ``job_id`` or ``dedupe_key`` is live.

    ``row`` is in :data:`BULK_COLUMNS` order with the payload as JSON text.
    ``may_conflict=False`` promises a fresh job_id and no dedupe key.
    """
    job_id, kind, queue, payload, priority, delay, max_attempts, dedupe_key, correlation_id, tenant = row
    sql = _INSERT_ONE_MAY_CONFLICT if may_conflict or dedupe_key is not None else _INSERT_ONE_FRESH
    params = (
        job_id,
        kind,
        queue,
        payload,
        priority,
        delay,  # twice: _RUN_AT reads it twice
        delay,
        max_attempts,
        dedupe_key,
        correlation_id,
        tenant,
        delay <= 0,
    )
    first = execute_prepared(sql, params)
    return int(first[0]) if first else None


# One statement for any number of jobs. The rows travel as one JSON document of positional
# arrays, parsed by the server: encoding it is one C-speed json.dumps, where ten parameter
# arrays cost psycopg's Python array dumper microseconds per element. `%(on_conflict)s` is
# left out when no row carries a dedupe key or an explicit job_id (nothing can conflict),
# sparing every row a speculative insertion.
_INSERT_MANY = f"""
WITH ins AS (
    INSERT INTO jobs (job_id, kind, queue, payload, priority, run_at, max_attempts,
                      dedupe_key, correlation_id, tenant)
    SELECT coalesce((r->>0)::uuid, gen_random_uuid()), r->>1, r->>2, (r->3)::jsonb,
           (r->>4)::int2, {_RUN_AT.format(delay="(r->>5)::float8")}, (r->>6)::int4,
           r->>7, r->>8, r->>9
      FROM json_array_elements(%s::json) AS r
    {{on_conflict}}
    RETURNING queue, run_at <= now() AS due
)
SELECT (SELECT count(*) FROM ins),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', q)) FROM (SELECT DISTINCT queue AS q FROM ins WHERE due) d)
"""

BULK_COLUMNS = (
    "job_id",
    "kind",
    "queue",
    "payload",
    "priority",
    "delay",
    "max_attempts",
    "dedupe_key",
    "correlation_id",
    "tenant",
)


def insert_jobs(rows_json: str, *, may_conflict: bool) -> int:
    """Insert many jobs in one statement; returns how many were new. ``rows_json`` is a JSON
    array of rows, each a positional array in :data:`BULK_COLUMNS` order (``payload`` an
    object, ``job_id`` null for a fresh one)."""
    sql = _INSERT_MANY.format(on_conflict="ON CONFLICT DO NOTHING" if may_conflict else "")
    # Prepared: the fan-out enqueues each page's deliver jobs with it, and it was planned at every call.
    first = execute_prepared(sql, [rows_json])
    return int(first[0]) if first else 0


# The bulk fast path: rows that need no dedupe, no explicit job_id and no delay go in by
# COPY, several times faster than any INSERT. run_at and created_at are left to their
# column defaults (the database clock); one NOTIFY per queue follows in the same
# transaction and is delivered at its commit.
_COPY_JOBS = "COPY jobs (job_id, kind, queue, payload, priority, max_attempts, correlation_id, tenant) FROM STDIN"
_NOTIFY_QUEUES = f"SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) AS q"


def copy_jobs(rows: Iterable[tuple]) -> int:
    """COPY due jobs in; each row is (job_id, kind, queue, payload_json, priority,
    max_attempts, correlation_id, tenant). MUST run inside a transaction (with its NOTIFY)."""
    if not connection.in_atomic_block:
        raise RuntimeError("copy_jobs() must run inside a transaction")
    connection.ensure_connection()
    queues: set[str] = set()
    count = 0
    with connection.wrap_database_errors, connection.connection.cursor() as raw, raw.copy(_COPY_JOBS) as copy:
        for row in rows:
            copy.write_row(row)
            queues.add(row[2])
            count += 1
    with connection.cursor() as cursor:
        cursor.execute(_NOTIFY_QUEUES, [sorted(queues)])
    return count


# --- settle ---------------------------------------------------------------------------

# The completer's batch: delete finished jobs still held under their leases (primary key,
# guarded on the token) and, for the fenced ones whose handler wrote nothing (jobs.runner.invoke:
# no transaction of theirs to fence), insert their fence rows, only for the rows whose
# delete matched: a lost lease writes neither. A fence row already there (another run of
# the job_id committed first) is left alone and the job is reported as a duplicate; its
# delete stands, as the fenced path's duplicate is finished too. Fence rows by primary key
# (ON CONFLICT on processed_jobs_pkey).
#
# A job woken while it ran (run_at after locked_at: jobs.storage.pull_forward_sql) was asked
# for a run after this one began (a resent delivery, a capture's poll): its name gets a new job
# due now, its identity kept, no attempt spent, a NOTIFY. Not after a cancel request (it wins)
# nor for `once` (the fenced kinds: their job_id is spent). Decided on the row the DELETE
# removes, so a wake committed while it waits for the row is seen (READ COMMITTED's recheck;
# RETURNING reads the newest version). Same name and job_id as the row deleted: no conflict.
_FINISH_MANY = f"""
WITH finished AS (
    DELETE FROM jobs j
     USING unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS s(id, token)
     WHERE j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, j.job_id, j.cancel_requested_at IS NOT NULL AS requested, j.cancel_requested_by, j.cancel_reason,
              j.run_at > j.locked_at AND j.cancel_requested_at IS NULL AND j.id <> ALL(%(once)s::bigint[]) AS woken,
              j.kind, j.queue, j.payload, j.priority, j.max_attempts, j.dedupe_key, j.correlation_id, j.tenant
),
again AS (
    INSERT INTO jobs (job_id, kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id, tenant)
    SELECT job_id, kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id, tenant
      FROM finished WHERE woken
    RETURNING pg_notify('{NOTIFY_CHANNEL}', queue)
),
fenced AS (
    INSERT INTO processed_jobs (job_id, kind, subject, processed_at, expires_at)
    SELECT d.job_id, f.kind, f.subject, now(), now() + make_interval(secs => %(ttl)s)
      FROM unnest(%(fence_ids)s::bigint[], %(fence_kinds)s::text[], %(fence_subjects)s::text[])
           AS f(id, kind, subject)
      JOIN finished d ON d.id = f.id
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id
)
SELECT d.id, d.requested, d.cancel_requested_by, d.cancel_reason,
       d.job_id IN (SELECT job_id FROM fenced), d.woken AND (SELECT count(*) FROM again) > 0
  FROM finished d
"""


def finish_many(
    leases: Sequence[tuple[int, uuid.UUID]],
    overtaken: list | None = None,
    *,
    fences: dict[int, tuple[str, str]] | None = None,
    ttl_seconds: float = 0.0,
    duplicates: set[int] | None = None,
    once: Iterable[int] = (),
    woken: set[int] | None = None,
) -> set[int]:
    """Delete finished jobs still held under these leases; returns the ids that matched.
    ``overtaken`` receives (id, requested_by, reason) of each deleted job that carried a
    cancel request its handler never saw (jobs.primitives.cancels: the finish overtook it).

    ``fences``: job pk -> (kind, subject) of the fenced jobs among them whose handler wrote
    nothing; each gets its fence row (kept ``ttl_seconds``) in the same statement, if its
    delete matched. ``duplicates`` receives the pks whose fence row already existed. A job
    woken while it ran runs again unless its pk is in ``once``; ``woken`` receives those pks."""
    if not leases:
        return set()
    fences = fences or {}
    rows = sql.bookkeeping_rows(
        _FINISH_MANY,
        {
            "ids": [i for i, _ in leases],
            "tokens": [t for _, t in leases],
            "once": list(once),
            "ttl": ttl_seconds,
            "fence_ids": list(fences),
            "fence_kinds": [kind for kind, _ in fences.values()],
            "fence_subjects": [subject[:255] for _, subject in fences.values()],
        },
        prepared=True,
        generic=True,  # primary keys in arrays (jobs_pkey, processed_jobs_pkey)
    )
    if overtaken is not None:
        overtaken.extend((r[0], r[2], r[3]) for r in rows if r[1])
    if duplicates is not None:
        duplicates.update(r[0] for r in rows if r[0] in fences and not r[4])
    if woken is not None:
        woken.update(r[0] for r in rows if r[5])
    return {r[0] for r in rows}


# Back to the queue after `delay` (primary key, guarded on the token), or at once for a
# `wakeable` reschedule (one that is no failure and no deferral) of a job woken while it ran
# (run_at after locked_at: jobs.storage.pull_forward_sql). A job that settles has shown it does not
# kill its worker: a suspect's crashes are cleared (jobs.storage.leases). Due at once: NOTIFY, so an
# idle worker takes it now rather than at its next poll. A job an operator asked to cancel
# is not re-queued: matching nothing, the settle ends it cancelled instead (jobs.primitives.cancels).
_RESCHEDULE = f"""
WITH moved AS (
    UPDATE jobs
       SET run_at = CASE WHEN %(wakeable)s AND run_at > locked_at THEN now()
                         ELSE now() + make_interval(secs => %(delay)s) END,
           locked_by = NULL, lease_token = NULL, locked_at = NULL,
           lease_expires_at = NULL, heartbeat_at = NULL, crashes = 0,
           attempts = CASE %(attempts)s WHEN 'reset' THEN 0
                                        WHEN 'refund' THEN greatest(attempts - 1, 0)
                                        ELSE attempts END,
           deferrals = CASE WHEN %(attempts)s = 'reset' THEN 0 ELSE deferrals END + %(add_deferral)s,
           last_error = %(error)s,
           unrunnable_since = CASE WHEN %(unrunnable)s THEN coalesce(unrunnable_since, now()) END
     WHERE id = %(id)s AND lease_token = %(token)s AND cancel_requested_at IS NULL
    RETURNING queue, run_at <= now() AS due
)
SELECT count(*), count(pg_notify('{NOTIFY_CHANNEL}', queue)) FILTER (WHERE due) FROM moved
"""


def reschedule(
    job_id: int,
    token: uuid.UUID,
    *,
    delay: float,
    attempts: str,
    add_deferral: bool,
    error: str,
    durable: bool,
    wakeable: bool = False,
    unrunnable: bool = False,
) -> bool:
    """Hand the job back to the queue to run after ``delay`` seconds (database clock), or at
    once when ``wakeable`` and it was pulled forward while it ran. ``durable`` for a
    failure's retry: its ``last_error`` is the evidence of the failure (a reschedule or a
    deferral that is no failure is bookkeeping). ``unrunnable``: this worker could not run
    it (``unrunnable_since`` is kept from the first such hand-back); any other settle clears
    it."""
    rows = (sql.durable_rows if durable else sql.bookkeeping_rows)(
        _RESCHEDULE,
        {
            "delay": delay,
            "wakeable": wakeable,
            "unrunnable": unrunnable,
            "attempts": attempts,
            "add_deferral": int(add_deferral),
            "error": bounded(error),
            "id": job_id,
            "token": token,
        },
    )
    return rows[0][0] == 1


DEAD_LETTER_COLUMNS = """job_id, kind, queue, payload, priority, tenant, correlation_id, attempts,
                          max_attempts, cause, error_category, last_error, job_created_at, dedupe_key"""

LETTER_RETURNING = "id, kind, queue, cause, attempts, correlation_id, tenant, job_id, error_category"

# Every new dead letter raises its alert in the statement that writes it: an `alerts` row
# (unique per dead letter) and a `send_alert` job to log and POST it (jobs.operator.alerts). So the
# alert exists if and only if the dead letter does, and racing writers cannot make two.
# Not for dead letters of `send_alert` itself: an alert endpoint that is down would
# otherwise alert about its own alerts forever; the worker logs those with alert=true.
# `{letters}` is a CTE returning LETTER_RETURNING.
ALERT_JOBS = """alert_jobs AS (
    INSERT INTO jobs (kind, queue, payload, priority, max_attempts, dedupe_key, correlation_id)
    SELECT 'send_alert', %(alert_queue)s, jsonb_build_object('alert_id', a.id), %(alert_priority)s,
           %(alert_max_attempts)s, 'alert:' || a.id, a.correlation_id
      FROM alerted a
    ON CONFLICT DO NOTHING
    RETURNING queue
)"""
ALERT_FOR_LETTERS = f"""
alerted AS (
    INSERT INTO alerts (key, title, severity, source, details, link)
    SELECT 'dead_letter:' || l.id,
           left('Dead letter ' || l.id || ': ' || l.kind || ' on ' || l.queue || ' (' || l.cause || ')', 300),
           CASE WHEN l.cause = 'configuration' THEN 'page' ELSE 'error' END,
           'jobs.dead_letter',
           jsonb_build_object('dead_letter_id', l.id, 'job_id', l.job_id, 'kind', l.kind, 'queue', l.queue,
                              'cause', l.cause, 'attempts', l.attempts, 'error_category', l.error_category,
                              'correlation_id', l.correlation_id, 'tenant', l.tenant),
           %(link_prefix)s || l.id || %(link_suffix)s
      FROM {{letters}} l
     WHERE l.kind <> 'send_alert'
    ON CONFLICT (key) DO NOTHING
    RETURNING id, details ->> 'correlation_id' AS correlation_id
),
{ALERT_JOBS}"""
NOTIFY_ALERT_JOBS = f"(SELECT count(pg_notify('{NOTIFY_CHANNEL}', queue)) FROM alert_jobs)"

# Delete and insert in one statement: the job is in exactly one of the two tables.
_DEAD_LETTER = f"""
WITH gone AS (
    DELETE FROM jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING *
),
letter AS (
    INSERT INTO dead_letters ({DEAD_LETTER_COLUMNS})
    SELECT job_id, kind, queue, payload, priority, tenant, correlation_id, attempts,
           max_attempts, %(cause)s, %(category)s, %(error)s, created_at, dedupe_key
      FROM gone
    RETURNING {LETTER_RETURNING}
),
{ALERT_FOR_LETTERS.format(letters="letter")}
SELECT id, {NOTIFY_ALERT_JOBS} FROM letter
"""


def dead_letter(job_id: int, token: uuid.UUID, *, cause: str, category: str, error: str) -> int | None:
    """Move the job to ``dead_letters`` (and raise its alert); returns the dead letter's id,
    None if the lease was lost. Durable: a dead letter is evidence."""
    rows = sql.durable_rows(
        _DEAD_LETTER,
        {
            "id": job_id,
            "token": token,
            "cause": cause,
            "category": category,
            "error": error[:20_000],
            **alert_job_params(),
        },
    )
    return rows[0][0] if rows else None


# Alert jobs run before ordinary work (lower priority runs first): a human should hear of a
# failure while it is fresh, not after the backlog that may have caused it.
ALERT_PRIORITY = -100


@functools.cache
def _dead_letter_link() -> tuple[str, str]:
    from django.urls import reverse

    path = reverse("admin:jobs_deadletter_change", args=[4242424242])
    prefix, suffix = path.split("4242424242")
    return prefix, suffix


def alert_job_params() -> dict:
    """The parameters of an alert's ``send_alert`` job and of a dead letter's admin link."""
    from jobs import registry
    from jobs.kinds import JobKind

    spec = registry.get(JobKind.SEND_ALERT)
    prefix, suffix = _dead_letter_link()
    return {
        "alert_queue": settings.VPAY_ALERT_QUEUE,
        "alert_priority": ALERT_PRIORITY,
        "alert_max_attempts": registry.retry_policy(spec).max_attempts if spec is not None else 5,
        "link_prefix": prefix,
        "link_suffix": suffix,
    }
