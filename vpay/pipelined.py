"""A hot statement prepared once per connection and sent together with the commands around
it (``BEGIN``, ``SET LOCAL``, ``COMMIT``) in one round trip: libpq's pipeline mode.

The worker's claim is a recursive statement that PostgreSQL took longer to plan than to run
(0.8-1.2 ms of planning for 0.8-1.3 ms of execution on a 20,000-job backlog,
``bench/out/claim_explain.md``), and the fenced finish pays a round trip for psycopg's
``BEGIN`` before its own. Sent as a libpq prepared statement in one pipeline with its
transaction commands, each costs one round trip and is parsed once per connection; the
server plans its first five calls for their parameters and then keeps a generic plan where
that costs no more (``plan_cache_mode`` auto), or, asked for it (``generic``, the claim's
case since a backlog made auto plan it at nearly every call), from the first. A kept plan
is only as good as the statistics it was made on: ``jobs.maintenance.statistics`` refreshes
those of a table that grew, which makes the plans on it again. Why libpq and not psycopg's ``prepare=True``: psycopg answers every rollback
on a connection where it prepared anything with ``DEALLOCATE ALL``, which would also drop
the statements :mod:`vpay.prepared` keeps there (see that module); here, as there, what is
prepared is remembered per libpq connection, and psycopg prepares nothing.

:func:`execute_pipelined` returns None when it cannot be used, and the caller runs its
statement the plain way: the same conditions as :func:`vpay.prepared.execute_prepared`
(an execute wrapper or query logging installed, ``VPAY_DB_PREPARED_STATEMENTS`` off, which
it always is behind a transaction pooler), or a transaction state the caller did not expect.
Rows are decoded by psycopg's own loaders (``psycopg.adapt.Transformer``, public API), so
they are what a Django cursor returns.

Parameters are ``%(name)s`` placeholders only (no literal ``%``); a parameter whose type its
context does not fix needs a cast in the SQL, as in :mod:`vpay.prepared`.
"""

from __future__ import annotations

import hashlib
import re
import select
from collections.abc import Mapping, Sequence

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import Transformer

from vpay.prepared import NO_SUCH_STATEMENT, SQLSTATE_FIELD, prepared_names, text_param

_IDLE = pq.TransactionStatus.IDLE
_INTRANS = pq.TransactionStatus.INTRANS
_CONNECTION_OK = pq.ConnStatus.OK
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_PREPARED = pq.ExecStatus.COMMAND_OK
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# sql -> (statement name, the sql with $n placeholders, parameter names in $n order)
_STATEMENTS: dict[str, tuple[bytes, bytes, list[str]]] = {}


class _Retry(Exception):
    """The prepared statement was gone (DEALLOCATE ALL, DISCARD ALL): prepare it again."""


def execute_pipelined(
    sql: str,
    params: Mapping[str, object],
    *,
    before: Sequence[bytes] = (),
    after: Sequence[bytes] = (),
    in_transaction: bool,
) -> list[tuple] | None:
    """Send ``before``, ``sql`` (prepared) and ``after`` in one round trip; ``sql``'s rows.

    ``in_transaction``: the caller is inside Django's ``atomic()`` (psycopg's connection not
    in autocommit); ``BEGIN`` is then sent first unless psycopg already sent it, and nothing
    may commit. Otherwise the connection must be idle in autocommit and ``before``/``after``
    make the transaction. None: not usable here, run the statement the plain way."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.execute_wrappers or db.queries_logged or not settings.VPAY_DB_PREPARED_STATEMENTS:
        return None
    db.close_if_health_check_failed()  # as Django's cursor() does first
    db.ensure_connection()
    conn = db.connection
    pgconn = conn.pgconn
    status = pgconn.transaction_status
    if in_transaction:
        if conn.autocommit or status not in (_IDLE, _INTRANS):
            return None
        if status == _IDLE and (
            conn.isolation_level is not None or conn.read_only is not None or conn.deferrable is not None
        ):
            return None  # psycopg's BEGIN would carry these; a bare one here would not
        # psycopg sends BEGIN only when it finds the connection idle: once this one has, it
        # finds the transaction open and sends nothing (psycopg's _start_query).
        before = (b"BEGIN", *before) if status == _IDLE else tuple(before)
    elif not (status == _IDLE and conn.autocommit):
        return None
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    name, dollar_sql, order = _statement(sql)
    # wrap_database_errors: callers see Django's exceptions, as from a Django cursor (a value
    # psycopg would refuse, such as a NUL in a text, included).
    with db.wrap_database_errors, conn.lock:
        values = [text_param(params[key]) for key in order]
        prepared = prepared_names(pgconn)
        try:
            try:
                result = _run(pgconn, prepared, name, dollar_sql, values, before, after)
            except _Retry:
                # Only where the failed pipeline was a whole transaction of its own; in the
                # caller's transaction the failure has aborted it.
                if in_transaction:
                    raise psycopg.OperationalError("a prepared statement vanished inside a transaction") from None
                _end_own_transaction(pgconn)
                try:
                    result = _run(pgconn, prepared, name, dollar_sql, values, before, after)
                except _Retry:
                    raise psycopg.OperationalError("a prepared statement vanished twice in a row") from None
        except psycopg.Error:
            if not in_transaction:
                _end_own_transaction(pgconn)  # its own transaction, aborted: never leave it open
            raise
        if not result.ntuples:
            return []
        # set_pgresult/load_rows are the loading protocol psycopg's own cursors use
        # (psycopg.abc.Transformer), not documented API: they decode the rows exactly as a
        # cursor would, for the price of two calls (psycopg is pinned; tests/test_pipelined.py
        # compares the claim's rows with the plain path's, type by type).
        transformer = Transformer(conn)
        transformer.set_pgresult(result)
        return transformer.load_rows(0, result.ntuples, tuple)


def _end_own_transaction(pgconn: pq.abc.PGconn) -> None:
    if pgconn.status == _CONNECTION_OK and pgconn.transaction_status != _IDLE:
        pgconn.exec_(b"ROLLBACK")


def _run(
    pgconn: pq.abc.PGconn,
    prepared: set[bytes],
    name: bytes,
    dollar_sql: bytes,
    values: list,
    before: Sequence[bytes],
    after: Sequence[bytes],
) -> pq.abc.PGresult:
    preparing = name not in prepared
    pgconn.enter_pipeline_mode()
    try:
        for command in before:
            pgconn.send_query_params(command, None)
        if preparing:
            pgconn.send_prepare(name, dollar_sql)
        pgconn.send_query_prepared(name, values)
        for command in after:
            pgconn.send_query_params(command, None)
        pgconn.pipeline_sync()
        _flush(pgconn)
        # One result per command sent, each followed by None; then the sync's.
        results = [_next_result(pgconn) for _ in range(len(before) + preparing + 1 + len(after))]
        sync = _next_result(pgconn, more=False)
        if sync is None or sync.status != _SYNC:
            raise psycopg.OperationalError("the pipeline ended without its sync")
    finally:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF:
            try:
                pgconn.exit_pipeline_mode()
            except psycopg.Error:
                pgconn.finish()  # results left unread (an error on the way): unusable for anyone else
    if preparing and (done := results[len(before)]) is not None and done.status == _PREPARED:
        # The server keeps a statement it prepared whatever became of the commands after it
        # (a rollback does not undo a prepare): remembered now, or the next call would
        # prepare the name again and fail on it (42P05) for the connection's life.
        prepared.add(name)
    failed = next((r for r in results if r is not None and r.status not in _OK and r.status != _ABORTED), None)
    if failed is not None:
        if failed.error_field(SQLSTATE_FIELD) == NO_SUCH_STATEMENT:
            prepared.discard(name)
            raise _Retry
        raise pg_errors.error_from_result(failed, encoding="utf-8")
    if any(r is None or r.status == _ABORTED for r in results):
        raise psycopg.OperationalError("a pipelined command did not run")
    result = results[len(before) + preparing]
    assert result is not None  # checked above
    return result


def _next_result(pgconn: pq.abc.PGconn, *, more: bool = True) -> pq.abc.PGresult | None:
    """The next result, waiting on the socket (GIL released) rather than in libpq; with
    ``more``, also the None that ends a command's results."""
    result = _get(pgconn)
    if more and result is not None and result.status != _SYNC:
        while _get(pgconn) is not None:  # a command's results end with None
            pass
    return result


def _get(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            return pgconn.get_result()
        if pgconn.status != _CONNECTION_OK:
            raise psycopg.OperationalError("the connection is lost")
        _wait(pgconn, select.POLLIN)


def _flush(pgconn: pq.abc.PGconn) -> None:
    # libpq: while a flush is incomplete, read what the server sends meanwhile, or both
    # sides may wait on full buffers.
    while pgconn.flush():
        if _wait(pgconn, select.POLLIN | select.POLLOUT) & select.POLLIN:
            pgconn.consume_input()


def _wait(pgconn: pq.abc.PGconn, events: int) -> int:
    """Wait (the GIL released) until the socket is ready; poll, not select: any fd number.
    No timeout, as psycopg's own wait: the server's statement_timeout bounds a statement,
    and a dead peer makes the socket readable."""
    poller = select.poll()
    poller.register(pgconn.socket, events | select.POLLERR | select.POLLHUP)
    ready = 0
    for _, happened in poller.poll():
        ready |= happened
    return ready


def _statement(sql: str) -> tuple[bytes, bytes, list[str]]:
    known = _STATEMENTS.get(sql)
    if known is None:
        order: list[str] = []

        def number(match: re.Match) -> str:
            key = match.group(1)
            if key not in order:
                order.append(key)
            return f"${order.index(key) + 1}"

        if "%%" in sql or "%s" in sql:
            raise ValueError("execute_pipelined takes %(name)s placeholders only")
        dollar = _PLACEHOLDER.sub(number, sql)
        # Named by content, as in vpay.prepared: two versions of a statement never collide.
        name = b"vpay_p_" + hashlib.sha256(sql.encode()).hexdigest()[:16].encode()
        known = _STATEMENTS[sql] = (name, dollar.encode(), order)
    return known


# A statement keyed on arrays (or with a LIMIT parameter) is planned again at almost every
# call under plan_cache_mode auto: an array shorter than the ten elements the generic plan is
# priced for makes every custom plan look cheaper. ``generic`` sends it with GENERIC_PLAN,
# and, in the caller's transaction, PLAN_AS_DEFAULT after it (every pipeline that plans a
# statement generic uses these two).
GENERIC_PLAN = b"SET LOCAL plan_cache_mode = force_generic_plan"
PLAN_AS_DEFAULT = b"SET LOCAL plan_cache_mode TO DEFAULT"


def fetch_prepared(sql: str, params: Mapping[str, object], *, generic: bool = False) -> list[tuple]:
    """``sql``'s rows (none for a statement without any), prepared where it may be: in the
    caller's transaction when it is inside ``atomic()`` (the ``BEGIN`` sent with it if it
    is the first statement), else alone in autocommit; through Django's cursor where it
    may not (see :func:`execute_pipelined`), with the same rows. ``generic``: planned once
    per connection (above), for a statement whose generic plan is as good as any custom one
    (primary keys in an array, a partial index whose predicate the SQL spells)."""
    db = connections[DEFAULT_DB_ALIAS]
    if not db.in_atomic_block:
        return _fetch(db, sql, params, in_transaction=False, generic=generic)
    # As a queryset's write does: a failure marks the transaction for rollback, so a caller
    # that catches it cannot commit what the server already aborted.
    with transaction.mark_for_rollback_on_error(DEFAULT_DB_ALIAS):
        return _fetch(db, sql, params, in_transaction=True, generic=generic)


def _fetch(db, sql: str, params: Mapping[str, object], *, in_transaction: bool, generic: bool) -> list[tuple]:
    if not generic:
        rows = execute_pipelined(sql, params, in_transaction=in_transaction)
    elif in_transaction:
        rows = execute_pipelined(sql, params, before=(GENERIC_PLAN,), after=(PLAN_AS_DEFAULT,), in_transaction=True)
    else:
        rows = execute_pipelined(sql, params, before=(b"BEGIN", GENERIC_PLAN), after=(b"COMMIT",), in_transaction=False)
    if rows is None:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall() if cursor.description else []
    return rows
