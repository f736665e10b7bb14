"""Hot single-row statements as server-side prepared statements on Django's connection.

Django binds parameters client-side and never prepares, so every call parses and plans
the statement again; on a one-by-one enqueue that is about a third of the server's work.
psycopg's ``prepare=True`` fixes the planning but keeps its Python layer (cursor, adapters,
the wait loop): this path enqueues 1.18x-1.23x faster (``bench/RUNNER.md``). And psycopg
answers every rollback on a connection where it has prepared anything with ``DEALLOCATE
ALL``. So :func:`execute_prepared`
prepares the statement with libpq itself and runs it with ``PQexecPrepared`` (which
releases the GIL while it waits), on the same connection and so in the caller's
transaction, while psycopg prepares nothing (``prepare_threshold`` is ``None``). What is
prepared is remembered per libpq connection, so a connection from Django's pool keeps its
statements under whichever wrapper it next serves.

It uses Django's cursor instead when an execute wrapper is installed (a test's statement
counter, instrumentation: they must see every statement), when queries are being logged (``DEBUG``,
``assertNumQueries``), when ``VPAY_DB_PREPARED_STATEMENTS`` is off (always with
``VPAY_DB_POOLER=transaction``: a pooled server session is not ours from one transaction
to the next, so a statement prepared on one is missing, or already there, on another), and
in a failed transaction (Django raises what it always raises there). Between ``atomic()``'s
start and its first statement it sends the ``BEGIN`` psycopg has not sent yet, in a round
trip of its own as psycopg would (``vpay.pipelined.fetch_prepared`` sends it in the
statement's).

Parameters are sent as text and typed by the server from the statement, so a parameter
whose type its context does not fix needs a cast in the SQL (``%s::float8``). The first row
comes back as text too (``None`` for NULL); a caller reads it with ``int(...)`` or the like,
which accepts both paths' values.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Sequence
from typing import cast

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg import errors as pg_errors
from psycopg import pq

_INTRANS = pq.TransactionStatus.INTRANS
_IDLE = pq.TransactionStatus.IDLE
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_CONNECTION_OK = pq.ConnStatus.OK
_RESULT_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
SQLSTATE_FIELD = pq.DiagnosticField.SQLSTATE
NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name

# (sql -> (statement name, the sql with $n placeholders)), built once per statement text.
_STATEMENTS: dict[str, tuple[bytes, bytes]] = {}


def execute_prepared_row(sql: str, params: Sequence) -> tuple:
    """:func:`execute_prepared` of a statement that always answers a row (an aggregate, an
    INSERT's RETURNING): its row. Only the SQL says so, which the type checker cannot read."""
    return cast(tuple, execute_prepared(sql, params))


def execute_prepared(sql: str, params: Sequence) -> tuple | None:
    """Run ``sql`` (``%s`` placeholders, no literal ``%``) with ``params``; its first row or ``None``."""
    db = connections[DEFAULT_DB_ALIAS]  # once: every attribute read through the proxy costs a lookup
    if not (db.execute_wrappers or db.queries_logged) and settings.VPAY_DB_PREPARED_STATEMENTS:
        db.close_if_health_check_failed()  # as Django's cursor() does first
        db.ensure_connection()
        conn = db.connection
        pgconn = conn.pgconn
        status = pgconn.transaction_status
        # Inside atomic() before its first statement psycopg has not sent BEGIN yet: send it
        # here, as psycopg would (it finds the transaction open and sends none of its own),
        # unless psycopg's BEGIN would carry an isolation level or access mode. Otherwise a
        # statement that opens a transaction (a lock taken first) went through Django's
        # cursor and was planned at every call (bench/WEBHOOKS.md).
        begin = (
            status == _IDLE
            and not conn.autocommit
            and db.in_atomic_block
            and conn.isolation_level is None
            and conn.read_only is None
            and conn.deferrable is None
        )
        if status == _INTRANS or (status == _IDLE and conn.autocommit) or begin:
            db.validate_thread_sharing()
            db.validate_no_broken_transaction()
            # wrap_database_errors: callers see Django's exceptions, as from a Django cursor.
            with db.wrap_database_errors, conn.lock:
                if not db.in_atomic_block:
                    return _exec_libpq(pgconn, sql, params, own_transaction=status == _IDLE)
                # As a queryset's write does: a failure marks the transaction for rollback,
                # so a caller that catches it cannot commit what the server already aborted
                # (its COMMIT would silently roll back, and on_commit callbacks still run).
                with transaction.mark_for_rollback_on_error(DEFAULT_DB_ALIAS):
                    if begin:
                        _check(pgconn, pgconn.exec_(b"BEGIN"), _COMMAND_OK)
                    return _exec_libpq(pgconn, sql, params, own_transaction=False)
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() if cursor.description else None  # None too for a statement without rows


def _exec_libpq(pgconn: pq.abc.PGconn, sql: str, params: Sequence, *, own_transaction: bool) -> tuple | None:
    name, dollar_sql = _statement(sql)
    prepared = prepared_names(pgconn)
    values = [text_param(p) for p in params]
    while True:
        if name not in prepared:
            _check(pgconn, pgconn.prepare(name, dollar_sql), _COMMAND_OK)
            prepared.add(name)
        result = pgconn.exec_prepared(name, values)
        if result.status in _RESULT_OK or result.error_field(SQLSTATE_FIELD) != NO_SUCH_STATEMENT:
            break
        # Deallocated under us (DEALLOCATE ALL, DISCARD ALL): prepare it again. In autocommit
        # the failed call was its own transaction and did nothing, so it is simply retried; in
        # the caller's transaction the failure has aborted it, and is raised.
        prepared.discard(name)
        if not own_transaction:
            break
        own_transaction = False  # once
    _check(pgconn, result, *_RESULT_OK)
    if not result.ntuples:
        return None
    return tuple(
        None if value is None else value.decode() for value in (result.get_value(0, i) for i in range(result.nfields))
    )


def _statement(sql: str) -> tuple[bytes, bytes]:
    known = _STATEMENTS.get(sql)
    if known is None:
        if "%%" in sql or "%(" in sql:
            raise ValueError("execute_prepared takes %s placeholders only")
        parts = sql.split("%s")
        dollar = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))
        # Named by content: two processes, or two versions of a statement, never collide.
        name = b"vpay_" + hashlib.sha256(sql.encode()).hexdigest()[:16].encode()
        known = _STATEMENTS[sql] = (name, dollar.encode())
    return known


# The statements prepared on each libpq connection, by connection: one from Django's pool
# (OPTIONS["pool"]) comes back under another wrapper with its statements still prepared.
# Holding the PGconn keeps its id from being reused; closed ones are dropped whenever a new
# connection is registered.
_PREPARED: dict[int, tuple[pq.abc.PGconn, set[bytes]]] = {}
_PREPARED_LOCK = threading.Lock()


def prepared_names(pgconn: pq.abc.PGconn) -> set[bytes]:
    entry = _PREPARED.get(id(pgconn))
    if entry is not None and entry[0] is pgconn:
        return entry[1]
    if pgconn.parameter_status(b"client_encoding") != b"UTF8":
        raise psycopg.InterfaceError("execute_prepared needs client_encoding UTF8 (Django's default)")
    with _PREPARED_LOCK:
        for key, (other, _) in list(_PREPARED.items()):
            if other.status != _CONNECTION_OK:
                del _PREPARED[key]
        entry = _PREPARED[id(pgconn)] = (pgconn, set())
    return entry[1]


def _check(pgconn: pq.abc.PGconn, result: pq.abc.PGresult, *ok: pq.ExecStatus) -> None:
    if result.status in ok:
        return
    if pgconn.status != _CONNECTION_OK:
        raise psycopg.OperationalError(f"the connection is lost: {pgconn.error_message.decode(errors='replace')}")
    raise pg_errors.error_from_result(result, encoding="utf-8")


def _str_text(value: str) -> bytes:
    # libpq ends a text parameter at its first NUL: refuse it, as psycopg's dumper does,
    # rather than send a truncated value.
    if "\x00" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value.encode()


# One encoder per parameter type, in PostgreSQL's text input format. Exact types, but for
# str and UUID subclasses: an int subclass (an IntEnum, say) is refused rather than sent as
# what it may not mean.
_TEXT = {
    str: _str_text,
    bool: lambda v: b"t" if v else b"f",
    int: lambda v: b"%d" % v,
    float: lambda v: repr(v).encode(),  # round-trips exactly; inf and nan are refused upstream
    uuid.UUID: lambda v: v.hex.encode(),
}


def _array_param(values: list | tuple) -> bytes:
    """A list as a PostgreSQL array literal: every element quoted, ``"`` and ``\\`` escaped,
    None as NULL (the server types it from the statement's cast, ``%s::bigint[]``)."""
    parts = []
    for value in values:
        if type(value) is list or type(value) is tuple:
            raise TypeError("execute_prepared cannot send a nested list (a multi-dimensional array)")
        text = text_param(value)
        if text is None:
            parts.append(b"NULL")
        else:
            parts.append(b'"' + text.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"')
    return b"{" + b",".join(parts) + b"}"


def text_param(value) -> bytes | None:
    if value is None:
        return None
    if type(value) is list or type(value) is tuple:
        return _array_param(value)
    try:
        return _TEXT[type(value)](value)
    except KeyError:
        if isinstance(value, str):  # a str subclass (a TextChoices member) is its text
            return _str_text(value)
        if isinstance(value, uuid.UUID):
            return value.hex.encode()
        raise TypeError(f"execute_prepared cannot send a {type(value).__name__}") from None
