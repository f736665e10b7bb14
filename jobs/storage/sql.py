"""The queue's two ways of running a statement: as durable evidence, or as lease bookkeeping.

Every queue statement goes through one of these, so which commits may be lost to a
database crash is decided in one place, statement by statement, where it is written.
"""

from __future__ import annotations

from typing import cast

from django.db import connection

from vpay.pipelined import GENERIC_PLAN, execute_pipelined

# Asynchronous commit, and no JIT (see bookkeeping), for one transaction.
_ASYNC_TRANSACTION = (b"BEGIN", b"SET LOCAL synchronous_commit TO off", b"SET LOCAL jit TO off")


def durable(sql: str, params) -> list[tuple] | int:
    """Run one statement whose commit must be durable (the server's ``synchronous_commit``):
    in autocommit its own transaction, else a statement of the caller's.

    Returns the rows of a statement that returns rows, else its row count.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def bookkeeping(sql: str, params, *, prepared: bool = False, generic: bool = False) -> list[tuple] | int:
    """Run one pure lease-bookkeeping statement (claim, finish, release, a lease's heartbeat)
    with asynchronous commit.

    Losing such a commit to a database crash only hands the job out again, which every
    handler is built to absorb (at-least-once, fenced). And WAL is sequential: any later
    synchronous commit, such as a handler's effect, makes it durable too. Skipping the
    flush is worth most of a claim's cost. Sent as one round trip (simple protocol).

    Never for evidence: a dead letter, or the error a retry records, goes through
    :func:`durable`. A crash that took a dead letter back would leave the job leased, and
    the reaper would rewrite it, the real error gone.

    Inside a caller's transaction (a test, an admin action) it runs as a plain statement
    of that transaction: committing someone else's transaction is never ours to do.

    ``prepared``: a statement that returns rows, run often enough that planning it every
    time costs more than it saves (the claim): prepared once per connection and sent with
    its transaction in one pipeline (:mod:`vpay.pipelined`) where the connection allows it.
    ``generic``: with ``prepared``, planned once per connection (``plan_cache_mode``), for a
    statement keyed on arrays of primary keys: left to ``auto``, the server plans it again at
    almost every call (a short array prices every custom plan below the generic one).
    """
    if connection.in_atomic_block or not connection.get_autocommit():
        return durable(sql, params)
    if prepared:
        try:
            before = (*_ASYNC_TRANSACTION, GENERIC_PLAN) if generic else _ASYNC_TRANSACTION
            rows = execute_pipelined(sql, params, before=before, after=(b"COMMIT",), in_transaction=False)
        except BaseException:
            connection.close()  # its transaction may be left open and aborted: never reuse it
            raise
        if rows is not None:
            return rows
    with connection.cursor() as cursor:
        try:
            # JIT off too: a claim planned against a table holding a million delayed jobs costs
            # enough to be JIT-compiled, and the compile took 1.2 s of a claim whose execution
            # took 7 ms (bench/SOAK.md); behind a pooler no startup option can say so.
            cursor.execute(f"BEGIN; SET LOCAL synchronous_commit TO off; SET LOCAL jit TO off; {sql}; COMMIT", params)
            cursor.nextset()  # SET synchronous_commit
            cursor.nextset()  # SET jit
            cursor.nextset()  # the statement
            result = cursor.fetchall() if cursor.description else cursor.rowcount
        except BaseException:
            # The explicit transaction may be left open and aborted: never reuse it.
            connection.close()
            raise
        cursor.nextset()  # COMMIT
    return result


# For a SELECT or a RETURNING statement, whose result is rows: only the SQL text says so,
# and the type checker cannot read it.
def durable_rows(sql: str, params) -> list[tuple]:
    """:func:`durable` for a statement that returns rows."""
    return cast(list[tuple], durable(sql, params))


def bookkeeping_rows(sql: str, params, *, prepared: bool = False, generic: bool = False) -> list[tuple]:
    """:func:`bookkeeping` for a statement that returns rows."""
    return cast(list[tuple], bookkeeping(sql, params, prepared=prepared, generic=generic))
