"""Small helpers the queue tests share: SQL reads and a claim made the way a Worker makes it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from contextlib import contextmanager

from django.db import connection

from jobs import registry
from jobs.kinds import JobKind
from jobs.runner.context import JobContext
from jobs.storage import leases
from jobs.storage.leases import ClaimedJob


def one(sql: str, params: Sequence | dict | None = None):
    """The first row of ``sql`` (a tuple), or None."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def scalar(sql: str, params: Sequence | dict | None = None):
    row = one(sql, params)
    return row[0] if row else None


def rows(sql: str, params: Sequence | dict | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def execute(sql: str, params: Sequence | dict | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def count(table: str, where: str = "TRUE", params: Sequence | None = None) -> int:
    return scalar(f"SELECT count(*) FROM {table} WHERE {where}", params)


def seconds_until_run(job_id: uuid.UUID | str) -> float:
    """``run_at`` minus the current statement's time, in seconds, on the database clock (a delay
    counts from its enqueueing statement, see jobs.storage.repository._RUN_AT)."""
    return scalar(
        "SELECT extract(epoch FROM run_at - statement_timestamp())::float8 FROM jobs WHERE job_id = %s", [str(job_id)]
    )


def task_payload(path: str = "tests.tasks.noop", *args, **kwargs) -> dict:
    return {"task": path, "args": list(args), "kwargs": kwargs}


def claim(
    worker: str = "worker-a",
    *,
    batch: int = 1,
    lease_seconds: float | None = None,
    after: str = "",
    max_tenants: int = 64,
    queues: Sequence[str] = ("default",),
    kinds: Sequence[str] | None = None,
    skip: Sequence[int] = (),
) -> leases.ClaimResult:
    """One claim statement with the arguments a :class:`jobs.runner.worker.Worker` passes
    (``skip``: primary keys to step over, as a dispatcher steps over jobs it cannot run now)."""
    kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
    return leases.claim(
        worker=worker,
        queues=list(queues),
        kinds=list(kind_leases) if kinds is None else list(kinds),
        batch=batch,
        lease_seconds=lease_seconds,
        kind_leases=kind_leases,
        default_lease=max(kind_leases.values()),
        after=after,
        max_tenants=max_tenants,
        skip=skip,
    )


def claim_statement_params(*, batch: int) -> dict:
    """The parameters of :data:`jobs.storage.leases.CLAIM` as a worker sends them, for an
    EXPLAIN of the statement itself."""
    kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
    return {
        "worker": "explain",
        "queues": ["default"],
        "kinds": list(kind_leases),
        "skip": [],
        "batch": batch,
        "lease": None,
        "leases": json.dumps(kind_leases),
        "default_lease": 60.0,
        "after": "",
        "max_tenants": 64,
    }


def claimed_context(job: ClaimedJob) -> JobContext:
    spec = registry.get(job.kind)
    return JobContext(job, spec.timeout_seconds)


def expire_lease(job_id: uuid.UUID | str) -> None:
    """Make a held lease look like its worker died: expired one second ago, on the DB clock."""
    assert execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = %s AND locked_at IS NOT NULL",
        [str(job_id)],
    )


def make_due(job_id: uuid.UUID | str | None = None) -> None:
    """Skip a job's backoff: due now (the database's now)."""
    if job_id is None:
        execute("UPDATE jobs SET run_at = now()")
    else:
        execute("UPDATE jobs SET run_at = now() WHERE job_id = %s", [str(job_id)])


@contextmanager
def failing_row(table: str, operation: str, row_id: str, message: str):
    """A real trigger that makes ``operation`` (``UPDATE``/``DELETE``) on one row of ``table``
    fail with ``message``: the database refuses that row, nothing in the code is faked."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_failing_row() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN RAISE EXCEPTION '{message}'; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER test_failing_row BEFORE {operation} ON {table} FOR EACH ROW"
            f" WHEN (OLD.id = '{row_id}') EXECUTE FUNCTION test_failing_row()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER test_failing_row ON {table}; DROP FUNCTION test_failing_row()")


# n due task jobs named prefix:1..n, in one statement; tenants: spread over t0..t(k-1), or none ('').
_INSERT_DUE_JOBS = (
    "INSERT INTO jobs (job_id, kind, queue, payload, priority, run_at, max_attempts, dedupe_key, tenant)"
    " SELECT gen_random_uuid(), %(kind)s, 'default', '{}', 0, now(), 5, %(prefix)s || ':' || g,"
    "        CASE WHEN %(tenants)s::int > 0 THEN 't' || (g %% %(tenants)s::int) ELSE '' END"
    "   FROM generate_series(1, %(n)s) g"
)


def insert_due_jobs(conn, n: int, *, prefix: str, tenants: int = 0) -> None:
    """``n`` due task jobs written through ``conn`` (a psycopg connection of the caller's: a
    backlog committed apart from the test's own connection)."""
    conn.execute(_INSERT_DUE_JOBS, {"n": n, "prefix": prefix, "tenants": tenants, "kind": JobKind.TASK.value})
