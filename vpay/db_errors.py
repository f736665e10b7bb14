"""A database that does not answer, in words an operator acts on.

A command that cannot start because PostgreSQL is unreachable, silent or blocked exits
with one line naming the bound that stopped it (``VPAY_DB_CONNECT_TIMEOUT``,
``VPAY_DB_STATEMENT_TIMEOUT_MS``) rather than a traceback: ``manage.py`` for every
command, and ``runworker``'s start-up check. Messages go through ``error_chain``, which
redacts (a connection error can quote the DSN it failed on).
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError
from psycopg import errors as pg

from vpay.errors import error_chain


def _causes(exc: BaseException):
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def unavailable_message(exc: BaseException) -> str | None:
    """What to tell an operator when ``exc`` means the database could not be used at all
    (no connection, no handshake, a query cancelled by the statement timeout); None for
    any other error, which deserves its traceback."""
    causes = list(_causes(exc))
    chain = error_chain(exc, 500)
    if any(isinstance(c, pg.ConnectionTimeout) for c in causes):
        return (
            f"the database did not complete the connection within VPAY_DB_CONNECT_TIMEOUT "
            f"({settings.DB_CONNECT_TIMEOUT} s): is the server up and reachable? ({chain})"
        )
    if any(isinstance(c, pg.QueryCanceled) for c in causes):
        return (
            f"a query was cancelled by the statement timeout, VPAY_DB_STATEMENT_TIMEOUT_MS "
            f"({settings.DB_STATEMENT_TIMEOUT_MS} ms): is another session holding a lock, such as a "
            f"migration in progress? ({chain})"
        )
    failed = next((c for c in causes if isinstance(c, psycopg.OperationalError)), None)
    if failed is not None and failed.sqlstate is None:
        # No SQLSTATE: the client could not connect (refused, no route, name unknown, the
        # server closed the socket) rather than the server refusing a statement.
        return f"cannot connect to the database (DATABASE_URL): {chain}"
    return None


def connection_lost(exc: BaseException, *, closed: bool) -> bool:
    """The connection failed (terminated, crashed server, network), as opposed to a statement
    failing on a healthy connection (a timeout, a constraint): the former is never the job's
    doing. Only database errors count; then a connection already closed (by Django) or
    marked broken (by psycopg) says so, and otherwise the SQLSTATE does: class 08
    (connection exception) and 57P01-03 (admin or crash shutdown, cannot connect now). An
    error with no SQLSTATE is the client's own (the socket went away). Pure."""
    if not isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError):
        return False
    if closed:
        return True
    cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is None:
        return isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError)
    return sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03")
