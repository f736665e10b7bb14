"""Application tasks the test suite enqueues through the Django Tasks API.

They are ordinary ``@task`` functions in an importable module, exactly what an
application writes; the worker (in-process or a real ``runworker`` subprocess) imports
and runs them. Effects go to the ``test_effects`` table (created by the ``effects``
fixture), inside the task's own transaction, which is the fence's transaction.
"""

from __future__ import annotations

import os
import threading
import time

from django.db import connection

from jobs.tasks_api import task
from vpay.errors import ConfigurationError, DeferError, PermanentError, TransientError


def _record(label: str, value: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_effects (label, value) VALUES (%s, %s)", [label, value])


@task
def record(label: str, value: str = "") -> None:
    """One row in test_effects per successful run: the observable effect."""
    _record(label, value)


@task
def record_slowly(label: str, seconds: float) -> None:
    time.sleep(seconds)
    _record(label)


@task
def record_slowly_once(label: str, seconds: float, marker: str) -> None:
    """Takes ``seconds`` the first time it runs (``marker`` then exists), none on a re-run:
    a job that holds its lease across an outage, then records once it is run again."""
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        time.sleep(seconds)
    _record(label)


@task
def use_a_database_that_is_down(port: int) -> None:
    """A task whose second database (not the job's own) refuses connections."""
    import psycopg

    psycopg.connect(f"postgresql://nobody@127.0.0.1:{port}/elsewhere", connect_timeout=2)


@task
def lose_own_connection() -> None:
    """The job's own connection is terminated by the server under the handler (as at a
    failover), from another connection."""
    from django.db import connection as own
    from django.db import connections

    pid = own.connection.info.backend_pid
    other = connections.create_connection("default")  # a second connection, as an operator's
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    _record("never")


@task
def record_then_sleep(label: str, seconds: float) -> None:
    """Records its start (the effect row's ``at`` is the insert's clock), then takes its time."""
    _record(label)
    time.sleep(seconds)


@task
def record_then_crash(label: str) -> None:
    """Writes its effect, then fails before commit: the fence must roll back with it."""
    _record(label)
    raise TransientError("induced failure after the effect, before commit")


@task
def fail_transiently(label: str) -> None:
    raise TransientError(f"transient failure for {label}")


@task
def fail_permanently(label: str) -> None:
    raise PermanentError(f"the far side refused {label} for good")


@task
def defer(label: str, seconds: float = 0.0) -> None:
    raise DeferError(f"breaker open for {label}", delay_seconds=seconds)


@task
def noop() -> None:
    """The benchmark's no-op."""


@task
def record_on_commit(label: str) -> None:
    """Writes nothing itself, but leaves its effect for the commit of its transaction."""
    from django.db import transaction

    transaction.on_commit(lambda: _record(label))


@task
def record_pid(label: str) -> None:
    _record(label, str(os.getpid()))


@task
def record_pid_slowly(label: str, seconds: float) -> None:
    """Takes its time, then records which process ran it: work to spread across workers."""
    time.sleep(seconds)
    _record(label, str(os.getpid()))


@task
def fail_with_configuration_error(label: str) -> None:
    raise ConfigurationError(f"credentials refused for {label}")


@task(takes_context=True)
def record_own_status(context, label: str) -> None:
    """Records the status the Tasks backend reports for this very task while it runs."""
    from jobs.tasks_api import default_task_backend

    _record(label, default_task_backend.get_result(context.task_result.id).status)


@task(takes_context=True)
def lose_lease(context, then: str = "succeed") -> None:
    """Another worker takes this job's lease while it runs (as after a reap), then the task
    succeeds, fails transiently or fails permanently. The take-over commits on its own
    connection, so it needs a test with real commits (``transaction=True``)."""
    job_id = context.task_result.id

    def take_over() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE jobs SET lease_token = gen_random_uuid(), locked_by = 'thief' WHERE job_id = %s",
                    [job_id],
                )
        finally:
            connection.close()

    thread = threading.Thread(target=take_over)
    thread.start()
    thread.join()
    if then == "fail":
        raise TransientError("failed after losing the lease")
    if then == "permanent":
        raise PermanentError("refused after losing the lease")


@task
def record_after_sql_sleep(label: str, seconds: float) -> None:
    """``record_slowly``, but waiting in PostgreSQL (``pg_sleep``) rather than ``time.sleep``:
    under libfaketime 0.9.10, Python's ``time.sleep`` fails with EINVAL (clock skew tests)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
    _record(label)


@task
def record_slowly_announced(label: str, seconds: float, started_file: str) -> None:
    """``record_slowly`` that first creates ``started_file``: a test in another process knows
    the handler itself is running (a claimed job may still be waiting its turn in the batch)."""
    with open(started_file, "a"):
        pass
    time.sleep(seconds)
    _record(label)


@task
def append_to_file(path: str, text: str) -> None:
    """An effect outside the database: it cannot be rolled back, so running twice shows."""
    with open(path, "a") as handle:
        handle.write(text)


@task
def append_on_commit(path: str, text: str, then_fail: bool = False) -> None:
    """Registers an on_commit side effect, then succeeds or fails."""
    from django.db import transaction

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # a query, so the group takes this body's savepoint
    transaction.on_commit(lambda: append_to_file.call(path, text))
    if then_fail:
        raise TransientError("failed after registering an on_commit callback")


@task
def kill_the_process() -> None:
    """A task that kills its own worker process outright, as an OOM kill or a segfault in a
    C extension would: nothing in the process gets to settle anything."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


@task
def exit_the_process() -> None:
    """A task that raises SystemExit: not an Exception, so it escapes the per-job handling."""
    raise SystemExit(3)


@task
def record_setting(label: str, name: str) -> None:
    """Records a server setting as the worker's own session sees it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        _record(label, cursor.fetchone()[0])


@task
def heartbeat_until_cancelled(label: str, seconds: float, started_file: str) -> None:
    """A long task that cooperates: it creates ``started_file``, then heartbeats through
    ``current_job()`` every 50 ms for ``seconds``, and records its effect only if it was
    never cancelled (a cancel rolls the effect back with the task's transaction anyway)."""
    from jobs import current_job

    with open(started_file, "a") as handle:
        handle.write("started\n")  # one line per run: a second run shows
    _record(label + ":began")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        current_job().heartbeat()
        time.sleep(0.05)
    _record(label)


def _request_own_cancel(reason: str) -> None:
    """Ask, from another connection (committed at once, as an operator's would be), to
    cancel the job running on this thread."""
    from jobs import current_job
    from jobs.services import cancels

    job_id = current_job().job_id

    def operator() -> None:
        try:
            cancels.job_cancel(job_id=job_id, actor="olga", reason=reason)
        finally:
            connection.close()

    thread = threading.Thread(target=operator)
    thread.start()
    thread.join()


@task
def cancelled_while_running(label: str, then: str) -> None:
    """Records an effect, is cancelled by an operator meanwhile, then heartbeats (obeys),
    returns (finishes first) or fails transiently."""
    from jobs import current_job

    _record(label)
    _request_own_cancel(f"stop {label}")
    if then == "heartbeat":
        current_job().heartbeat()
    elif then == "fail":
        raise TransientError("failed after the cancel request")


@task
def raise_job_cancelled_unasked() -> None:
    """Nobody asked to cancel it: a JobCancelled of its own is just an error."""
    from jobs import JobCancelled

    raise JobCancelled()


@task
def append_then_fail_until(path: str, text: str, succeed_on: int) -> None:
    """Appends ``text`` to ``path`` (outside the database: every attempt shows), then fails
    transiently until the file holds ``succeed_on`` of them."""
    append_to_file.call(path, text)
    with open(path) as handle:
        if handle.read().count(text) < succeed_on:
            raise TransientError(f"attempt failed on purpose ({text})")
