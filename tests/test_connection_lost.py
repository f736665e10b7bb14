"""The runner's table for "the database went away under the handler" (jobs.runner.invoke.connection_lost):
a job whose connection failed is handed back with its attempt refunded; one whose statement
failed on a healthy connection is an ordinary failure. Every row of the table."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError
from psycopg import errors as pg

from vpay.db_errors import connection_lost


def wrapped(cause: BaseException) -> OperationalError:
    """As Django raises it: its own class, psycopg's error as the cause."""
    exc = OperationalError(str(cause))
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "closed", "lost"),
    [
        (pg.AdminShutdown("terminated"), False, True),  # 57P01, pg_terminate_backend
        (pg.CrashShutdown("crash"), False, True),  # 57P02
        (pg.CannotConnectNow("starting"), False, True),  # 57P03
        (pg.ConnectionException("08000"), False, True),
        (pg.ConnectionFailure("08006"), False, True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), False, True),  # no SQLSTATE
        (psycopg.InterfaceError("the connection is closed"), False, True),
        (wrapped(pg.AdminShutdown("terminated")), False, True),
        (wrapped(pg.QueryCanceled("statement timeout")), False, False),  # 57014: the statement, not the link
        (pg.QueryCanceled("statement timeout"), False, False),
        (pg.LockNotAvailable("lock timeout"), False, False),
        (wrapped(pg.QueryCanceled("statement timeout")), True, True),  # but the connection is gone too
        (pg.UniqueViolation("23505"), True, False),  # not an operational error at all
        (IntegrityError("constraint"), True, False),
        (ValueError("a bug in the handler"), True, False),
    ],
)
def test_only_a_failed_connection_counts_as_the_database_going_away(exc, closed, lost):
    assert connection_lost(exc, closed=closed) is lost


# --- whose connection: only the job's own (jobs.runner.invoke.database_went_away) -------------------


@pytest.mark.django_db(transaction=True)
def test_a_second_database_that_is_down_is_the_handlers_failure_not_an_outage():
    from jobs.runner.worker import Worker
    from tests import tasks
    from tests.owned_postgres import free_port
    from tests.queue_support import one

    result = tasks.use_a_database_that_is_down.enqueue(free_port())
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    attempts, last_error = one("SELECT attempts, last_error FROM jobs WHERE job_id = %s", [result.id])
    # Retried on its backoff with the attempt spent (a refund would loop at zero attempts).
    assert attempts == 1
    assert "OperationalError" in last_error
    assert (worker.report().retried, worker.report().released) == (1, 0)


@pytest.mark.django_db(transaction=True)
def test_the_jobs_own_connection_terminated_under_the_handler_is_an_outage():
    from jobs.runner.worker import Worker
    from tests import tasks
    from tests.queue_support import one

    result = tasks.lose_own_connection.enqueue()
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert worker.report().released == 1  # handed back, attempt refunded
    assert one("SELECT attempts FROM jobs WHERE job_id = %s", [result.id]) == (0,)
