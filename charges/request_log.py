"""``provider_requests``: every rail request, written (and committed) before it is sent and
answered after, whatever happened — the evidence crash recovery reads, and the count the
rail's ceiling of requests in flight is taken from (``charges.services.rail_calls``)."""

from __future__ import annotations

from django.db import connection
from psycopg import sql

from charges.models import EXCERPT_MAX, RequestOperation
from charges.states import RailStatus
from vpay.logging import redact
from vpay.pipelined import GENERIC_PLAN, execute_pipelined, fetch_prepared
from vpay.prepared import execute_prepared_row


def record_sent(
    charge_id: str,
    operation: RequestOperation,
    *,
    rail: str,
    method: str,
    path: str,
    idempotency_key: str | None,
    refund_id: str | None = None,
) -> int:
    """Write the request row. Called outside a transaction, so it is committed before the
    request goes out: a crash during the call leaves a row with ``status_code`` NULL."""
    if connection.in_atomic_block or not connection.get_autocommit():
        raise RuntimeError("a rail request must be recorded (committed) before it is sent")
    row = execute_prepared_row(
        _RECORD_SENT, [charge_id, refund_id, str(operation), rail, method, path[:300], idempotency_key]
    )
    return int(row[0])


# The request row, in autocommit (committed before the request goes out); its other columns
# take their database defaults (sent_at is the statement's instant), as the ORM's create did.
# Plain SQL: the confirm writes one per payment, and compiling the insert cost more of the
# web process's CPU than the statement costs the database; prepared (vpay.prepared), as it
# was planned at every call. No index read.
_RECORD_SENT = """
INSERT INTO provider_requests (charge_id, refund_id, operation, rail, method, path, idempotency_key)
VALUES (%s, %s, %s, %s, %s, %s, %s)
RETURNING id
"""


# One round trip, one transaction, several statements: the rail's lock, then its requests
# in flight counted and, below the ceiling, the new request row written, then the commit. The
# count-and-insert is prepared (vpay.pipelined: BEGIN, the lock, it and COMMIT in one
# pipeline), as planning it at every request cost the database more than running it; where
# nothing may be prepared (behind a transaction pooler, or with queries logged) the four go
# as one simple query.
#
# * The lock: a transaction-scoped advisory lock per rail (there is no rails table to lock
#   a row of: rails are configuration), serializing the count and the insert across
#   workers so two cannot both take the last slot; released at commit. The statements
#   after it run server-side with no client round trip while it is held, so the lock is
#   held for microseconds, not for three round trips of a busy client.
# * The count is a statement of its own, after the lock's: under READ COMMITTED each
#   statement takes its snapshot when it starts, so it sees every row committed by the
#   previous holder. (Counted in the lock's own statement it would not: that snapshot
#   predates the wait for the lock.) In flight: sent, unanswered, younger than the bound
#   (the rail timeout plus a margin; the adapter ends every exchange by its deadline, so an
#   older unanswered row is a crashed worker's and holds no slot). With it, the seconds
#   until the earliest of them passes the bound (the latest a slot can stay taken). Served
#   by provider_requests_in_flight (partial: answered rows, nearly all of them, cost nothing).
# * The insert: its columns not named here take their database defaults (sent_at is the
#   statement's timestamp), as the ORM's create would; no index read.
# * For a submit (a charge's, a refund's, a capture, a void), whether an earlier one went out
#   for the same object (the refund, else the charge; a capture or a void since it was asked
#   for, so a capture asked for again after a refusal is a first send): whether this one is
#   a resend (false for a status read). Decided here, in
#   the statement that records the request, after the lock, so it sees every send
#   committed before it (a concurrent run's included), and never from a read taken before
#   the send. The insert's own row is invisible to it (one statement, one snapshot).
#   provider_requests_refund_op or provider_requests_charge_op (only the arm taken runs; a
#   capture's or a void's reads its charge by charges_pkey).
# * The commit is the server's synchronous commit: the row is durable before the request
#   goes out (crash recovery reads it).
#
# The lock's statement names the rail as a quoted literal: a pipeline carries one prepared
# statement with parameters, the count-and-insert. That one is planned generic: left to
# plan_cache_mode auto, the server planned it afresh at every request (custom plans priced
# cheaper), which cost more than its run; the generic plan reads the same indexes.
_LOCK_RAIL = "SELECT pg_advisory_xact_lock(hashtextextended('vpay:rail_in_flight:' || {rail}, 0))"
_WITHIN_CEILING = """
WITH in_flight AS (
    SELECT count(*) AS n,
           extract(epoch FROM min(sent_at) + make_interval(secs => %(bound)s::float8) - now())::float8 AS earliest_left
      FROM provider_requests
     WHERE rail = %(rail)s::text AND answered_at IS NULL AND sent_at > now() - make_interval(secs => %(bound)s::float8)
), sent AS (
    INSERT INTO provider_requests (charge_id, refund_id, operation, rail, method, path, idempotency_key)
    SELECT %(charge_id)s::text, %(refund_id)s::text, %(operation)s::text, %(rail)s::text, %(method)s::text,
           %(path)s::text, %(idempotency_key)s::text
      FROM in_flight
     WHERE n < %(ceiling)s::int
    RETURNING id
)
SELECT (SELECT id FROM sent), earliest_left,
       CASE WHEN %(operation)s NOT IN ('submit', 'refund_submit', 'capture', 'void') THEN false
            WHEN %(operation)s IN ('capture', 'void')
            THEN EXISTS (SELECT 1 FROM provider_requests e JOIN charges c ON c.id = e.charge_id
                          WHERE e.charge_id = %(charge_id)s AND e.operation = %(operation)s
                            AND e.sent_at >= coalesce(CASE %(operation)s WHEN 'capture' THEN c.capture_requested_at
                                                                         ELSE c.void_requested_at END,
                                                      '-infinity'))
            WHEN %(refund_id)s::text IS NULL
            THEN EXISTS (SELECT 1 FROM provider_requests e
                          WHERE e.charge_id = %(charge_id)s AND e.operation = %(operation)s)
            ELSE EXISTS (SELECT 1 FROM provider_requests e
                          WHERE e.refund_id = %(refund_id)s AND e.operation = %(operation)s)
       END
  FROM in_flight
"""


def record_sent_within_ceiling(
    charge_id: str,
    operation: RequestOperation,
    *,
    rail: str,
    method: str,
    path: str,
    idempotency_key: str | None,
    ceiling: int,
    bound_seconds: float,
    refund_id: str | None = None,
) -> tuple[int | None, float | None, bool]:
    """:func:`record_sent`, unless ``rail`` already has ``ceiling`` requests in flight.

    Returns the new row's id (committed, before the request is sent) or None at the
    ceiling, the seconds until the earliest request in flight passes its bound, and
    for a submit, whether one went out for the same refund (else charge) before this one:
    that it is a resend."""
    if connection.in_atomic_block or not connection.get_autocommit():
        raise RuntimeError("a rail request must be recorded (committed) before it is sent")
    params = {
        "charge_id": charge_id,
        "refund_id": refund_id,
        "operation": str(operation),
        "rail": rail,
        "method": method,
        "path": path[:300],
        "idempotency_key": idempotency_key,
        "ceiling": ceiling,
        "bound": bound_seconds,
    }
    lock = _LOCK_RAIL.format(rail=sql.Literal(rail).as_string(None))
    try:
        rows = execute_pipelined(
            _WITHIN_CEILING,
            params,
            before=(b"BEGIN", GENERIC_PLAN, lock.encode()),
            after=(b"COMMIT",),
            in_transaction=False,
        )
        if rows is None:
            with connection.cursor() as cursor:
                cursor.execute(f"BEGIN; {lock.replace('%', '%%')}; {_WITHIN_CEILING}; COMMIT", params)
                cursor.nextset()  # the lock
                cursor.nextset()  # the count and the insert
                rows = cursor.fetchall()
                cursor.nextset()  # COMMIT
    except BaseException:
        # The explicit transaction may be left open and aborted: never reuse it.
        connection.close()
        raise
    request_id, earliest_left, earlier = rows[0]
    return request_id, earliest_left, earlier


# The answer on its request row, once (provider_requests_pkey; the guard on answered_at makes
# a second answer, which only a bug could send, write nothing). Plain SQL rather than the
# ORM's update: it runs on every rail call, and compiling the queryset cost more of the
# worker's CPU than the statement costs the database; prepared (vpay.pipelined), as planning
# it each time cost the database about as much as running it. answered_at is the statement's
# instant, as Now() was.
_RECORD_ANSWER = """
UPDATE provider_requests
   SET answered_at = statement_timestamp(), status_code = %(status_code)s, rail_status = %(rail_status)s,
       error = %(error)s, response_excerpt = %(excerpt)s
 WHERE id = %(id)s AND answered_at IS NULL
"""


def record_answer(
    request_id: int,
    *,
    status_code: int | None,
    rail_status: RailStatus | None = None,
    error: str = "",
    excerpt: str = "",
) -> None:
    """Answer a request row (``status_code`` None: a transport failure, recorded with its cause)."""
    fetch_prepared(
        _RECORD_ANSWER,
        {
            "status_code": status_code,
            "rail_status": str(rail_status) if rail_status is not None else None,
            "error": redact(error)[: EXCERPT_MAX * 2],
            # The adapter built the excerpt with the pay_token and every URL already removed
            # (rails/excerpts.py, answer_excerpt); redact() is the second net for credentials.
            "excerpt": redact(excerpt)[:EXCERPT_MAX],
            "id": request_id,
        },
    )


def hand_over_slot(
    request_id: int,
    *,
    status_code: int,
    rail_status: RailStatus,
    excerpt: str,
    charge_id: str,
    rail: str,
    path: str,
    within_seconds: float,
) -> int | None:
    """Answer the status read ``request_id`` and write the next one's row (for ``charge_id``)
    in its slot of the rail's ceiling: the id of the new row, or None where the answered
    request was sent ``within_seconds`` ago or longer (the answer is recorded; the next row
    is the ceiling's to admit). Only inside the caller's transaction, which settles the
    answered charge and commits the new row before its request goes out
    (``charges.services.status_answers``)."""
    if not connection.in_atomic_block:
        raise RuntimeError("a slot passes on inside the transaction that records its answer")
    rows = fetch_prepared(
        _HAND_OVER_SLOT,
        {
            "status_code": status_code,
            "rail_status": str(rail_status),
            "excerpt": redact(excerpt)[:EXCERPT_MAX],  # as in record_answer
            "id": request_id,
            "charge_id": charge_id,
            "operation": str(RequestOperation.STATUS),
            "rail": rail,
            "path": path[:300],
            "within": within_seconds,
        },
    )
    return rows[0][0] if rows else None


# A status read's slot of the ceiling passes to the next one: its answer and the next
# request's row in one statement (charges.services.status_answers says why). The count in
# flight does not move, so no lock: before the commit a counter sees the answered request
# unanswered and not the new row, after it the new row and the answer; never both. Never
# neither either, as long as the answered request still counts when the new row becomes
# visible: it counts until its bound (the rail timeout plus IN_FLIGHT_MARGIN_SECONDS), and
# it is handed over only while younger than the rail timeout (within), so the commit has
# the margin to spare. An older one's successor is left to the ceiling (no row inserted;
# the answer is recorded all the same). The new row is sent at the statement's instant, not
# at the settlement's start. The update reads provider_requests_pkey; the insert no index.
_HAND_OVER_SLOT = """
WITH answered AS (
    UPDATE provider_requests
       SET answered_at = statement_timestamp(), status_code = %(status_code)s::int,
           rail_status = %(rail_status)s::text, error = '', response_excerpt = %(excerpt)s::text
     WHERE id = %(id)s::bigint AND answered_at IS NULL
    RETURNING rail, sent_at > statement_timestamp() - make_interval(secs => %(within)s::float8) AS held
)
INSERT INTO provider_requests (charge_id, operation, rail, method, path, sent_at)
SELECT %(charge_id)s::text, %(operation)s::text, rail, 'GET', %(path)s::text, statement_timestamp()
  FROM answered
 WHERE held AND rail = %(rail)s::text
RETURNING id
"""
