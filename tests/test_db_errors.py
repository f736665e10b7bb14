"""``vpay.db_errors.unavailable_message``: which database errors become one line naming the
bound that stopped the command, and which keep their traceback. Every row of the table."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, ProgrammingError
from psycopg import errors as pg

from vpay.db_errors import unavailable_message


def wrapped(cause: BaseException, outer: type[Exception] = OperationalError) -> Exception:
    """As Django raises it: its own class, psycopg's error as the cause."""
    exc = outer(str(cause))
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "names"),
    [
        (wrapped(pg.ConnectionTimeout("connection timeout expired")), "VPAY_DB_CONNECT_TIMEOUT"),
        (pg.ConnectionTimeout("connection timeout expired"), "VPAY_DB_CONNECT_TIMEOUT"),
        (wrapped(pg.QueryCanceled("canceling statement due to statement timeout")), "VPAY_DB_STATEMENT_TIMEOUT_MS"),
        (wrapped(psycopg.OperationalError("connection failed: Connection refused")), "DATABASE_URL"),
        (wrapped(pg.UndefinedTable("relation does not exist"), ProgrammingError), None),
        (wrapped(pg.UniqueViolation("duplicate key"), IntegrityError), None),
        (wrapped(pg.AdminShutdown("terminating connection due to administrator command")), None),
        (ValueError("not a database error"), None),
    ],
)
def test_only_an_unreachable_silent_or_blocked_database_is_put_in_one_line(exc, names, settings):
    settings.DB_CONNECT_TIMEOUT, settings.DB_STATEMENT_TIMEOUT_MS = 7, 1234
    message = unavailable_message(exc)
    if names is None:
        assert message is None
    else:
        assert names in message and "Traceback" not in message
        assert ("7 s" in message) if names == "VPAY_DB_CONNECT_TIMEOUT" else True
        assert ("1234 ms" in message) if names == "VPAY_DB_STATEMENT_TIMEOUT_MS" else True


def test_the_message_is_redacted(settings):
    exc = wrapped(psycopg.OperationalError("connection to postgresql://vpay:S3cretPw-Xy9_zq@db:5432/vpay failed"))
    message = unavailable_message(exc)
    assert message is not None and "S3cretPw-Xy9_zq" not in message
