"""The SQL of a batch of delivery attempts (``webhooks.services.delivery``'s group commits):
the read of what they send, the claim under the deliveries' and their endpoints' row locks,
and the fenced record of their outcomes, each a statement for the whole batch. A batch of
one takes :mod:`webhooks.attempt_sql`'s single-row statements instead: planned once per
connection on a primary key, they cost less than these at one row (and most batches are one
row when the worker is not busy). Every instant is the database's.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from psycopg import sql

from vpay.pipelined import GENERIC_PLAN, PLAN_AS_DEFAULT, execute_pipelined
from webhooks import attempt_sql
from webhooks.attempt_sql import DeliveryRow, Lease, Loaded, _float
from webhooks.repository import CANCELLED_ENDPOINT_DELETED, ERROR_MAX, EXCERPT_MAX, _bounded

# Each statement here takes its batch as arrays. Prepared (vpay.pipelined: parsed once per
# connection), PostgreSQL would still plan them again on every call: a custom plan for a
# one-element array costs less than the generic plan (priced for ten), so plan_cache_mode
# auto rarely settles on the generic one (an array shorter than the ten elements the generic
# plan is priced for makes every custom plan look cheaper: pg_prepared_statements showed 0
# generic plans to 1,500 custom, 0.3-1.5 ms of planning each). So each is sent with SET LOCAL
# plan_cache_mode = force_generic_plan in the same round trip (in its own transaction where
# the caller has none) and, inside the caller's, set back after it, so nothing else of that
# transaction is planned so. The generic plans lead with the primary keys the arrays name.
# The first also sets LOCK_TIMEOUT for the rest of its transaction (a batch's: every
# statement a batch runs, single-row ones included, comes after one of these): a batch
# stalled on one contended row would stall every executor in it, so it fails instead and
# each request runs again alone (jobs.primitives.group_commit), waiting only for itself. Not
# on the plain path (behind a transaction pooler), where a batch waits as a request would.
# Values come back typed; on the plain path (queries captured, prepared statements off behind
# a pooler) as Django's cursor returns them: the readers take both.
LOCK_TIMEOUT = b"SET LOCAL lock_timeout = '2s'"
_NAMED: dict[str, str] = {}


def _rows(sql: str, params: Sequence, first: str = "") -> list[tuple]:
    """``sql`` (``%s`` placeholders) run with a generic plan (above); its rows. ``first``: a
    statement without parameters run just before it, in the same round trip where it may be."""
    named = _NAMED.get(sql)
    if named is None:
        named = _NAMED[sql] = _name_placeholders(sql)
    values = {f"p{i}": value for i, value in enumerate(params, start=1)}
    before = (GENERIC_PLAN, LOCK_TIMEOUT, first.encode()) if first else (GENERIC_PLAN, LOCK_TIMEOUT)
    if connection.in_atomic_block:
        # As fetch_prepared does: a failure marks the transaction for rollback.
        with transaction.mark_for_rollback_on_error():
            rows = execute_pipelined(named, values, before=before, after=(PLAN_AS_DEFAULT,), in_transaction=True)
    else:
        rows = execute_pipelined(named, values, before=(b"BEGIN", *before), after=(b"COMMIT",), in_transaction=False)
    if rows is None:
        with connection.cursor() as cursor:
            if first:
                cursor.execute(first)
            cursor.execute(named, values)
            return cursor.fetchall() if cursor.description else []
    return rows


def _name_placeholders(sql: str) -> str:
    parts = sql.split("%s")
    return parts[0] + "".join(f"%(p{i})s{part}" for i, part in enumerate(parts[1:], start=1))


# Everything the attempts of a batch send, in one read (attempt_sql.LOAD_SELECT's columns):
# the deliveries by primary key.
_LOAD = attempt_sql.LOAD_SELECT + " WHERE d.id = ANY(%s::bigint[])"


def load_deliveries(delivery_ids: Sequence[int]) -> dict[int, Loaded]:
    """The deliveries of ``delivery_ids`` that exist, with what their attempts send."""
    if len(delivery_ids) == 1:
        one = attempt_sql.load_delivery(delivery_ids[0])
        return {one.id: one} if one is not None else {}
    loaded = {}
    for row in _rows(_LOAD, [list(delivery_ids)]):
        one = attempt_sql.loaded_from(row)
        loaded[one.id] = one
    return loaded


# The deliveries (attempt_sql.LOCK_SELECT's columns), locked FOR UPDATE in id order: every
# batch, and the endpoint delete's cancel, takes its locks in one order. Primary keys.
_LOCK = attempt_sql.LOCK_SELECT + " WHERE d.id = ANY(%s::bigint[]) ORDER BY d.id FOR UPDATE OF d"


def lock_deliveries(delivery_ids: Sequence[int]) -> dict[int, DeliveryRow]:
    """Those of ``delivery_ids`` that exist, locked (MUST run in a transaction)."""
    if len(delivery_ids) == 1:
        row = attempt_sql.lock_delivery(delivery_ids[0])
        return {row.id: row} if row is not None else {}
    rows = {}
    for found in _rows(_LOCK, [sorted(delivery_ids)]):
        row = attempt_sql.delivery_row_from(found)
        rows[row.id] = row
    return rows


def in_flight_for_endpoints(endpoint_ids: Sequence[str]) -> dict[str, tuple[int, float | None, int | None]]:
    """Per endpoint: the attempts holding a live lease, counted under the endpoint's row lock
    so two workers cannot both take the last slot, the seconds until the earliest of those
    leases expires (the latest a slot can stay taken; None: no live lease), and its due
    deliveries, counted up to one more than ``endpoint_ids`` names it (asked for one endpoint,
    the idle case; for several: None, not counted). MUST run in a transaction."""
    if len(set(endpoint_ids)) == 1:
        return {endpoint_ids[0]: attempt_sql.in_flight_for_endpoint(endpoint_ids[0], len(endpoint_ids))}
    ordered = sorted(set(endpoint_ids))
    # The locks (primary key, in id order), then the count (the partial index
    # webhook_deliveries_in_flight), as two statements in one round trip, as for one endpoint
    # (attempt_sql._LOCK_ENDPOINT): the count's snapshot is taken once the locks are granted.
    lock = "SELECT 1 FROM webhook_endpoints WHERE id = ANY({ids}::text[]) ORDER BY id FOR NO KEY UPDATE"
    counted = {
        endpoint: (int(n), _float(earliest))
        for endpoint, n, earliest in _rows(
            "SELECT endpoint_id, count(*), EXTRACT(EPOCH FROM min(lease_expires_at) - now())::float8"
            " FROM webhook_deliveries WHERE endpoint_id = ANY(%s::text[]) AND state = 'delivering'"
            " AND lease_expires_at > now() GROUP BY endpoint_id",
            [ordered],
            first=lock.format(ids=sql.Literal(ordered).as_string(None)),
        )
    }
    return {endpoint: (*counted.get(endpoint, (0, None)), None) for endpoint in ordered}


# ``pending → delivering`` with a fresh lease each, and their attempt rows written from what
# the moves returned, in one statement (primary keys; the caller holds the rows' locks).
_START = """
WITH p(id, token) AS (SELECT * FROM unnest(%s::bigint[], %s::uuid[])),
moved AS (
    UPDATE webhook_deliveries d
       SET state = 'delivering', attempts = attempts + 1, lease_token = p.token,
           lease_expires_at = now() + make_interval(secs => %s::float8), updated_at = now()
      FROM p
     WHERE d.id = p.id AND d.state = 'pending'
 RETURNING d.id, d.attempts, d.attempts - d.ladder_base AS rung, d.endpoint_id, d.payload_sha256, p.token
), attempt AS (
    INSERT INTO webhook_delivery_attempts (delivery_id, number, lease_token, state, started_at, response_excerpt, error)
    SELECT moved.id, moved.attempts, moved.token, 'in_flight', now(), '', '' FROM moved
    RETURNING id, delivery_id
)
SELECT moved.id, attempt.id, moved.attempts, moved.rung, moved.token,
       floor(EXTRACT(EPOCH FROM clock_timestamp()))::bigint, moved.endpoint_id, moved.payload_sha256
  FROM moved JOIN attempt ON attempt.delivery_id = moved.id
"""


def start_attempts(delivery_ids: Sequence[int], lease_seconds: float) -> dict[int, Lease]:
    """Start an attempt of each delivery, in the caller's transaction (the caller checked
    due-ness and the cap under the same locks)."""
    if len(delivery_ids) == 1:
        return {delivery_ids[0]: attempt_sql.start_attempt(delivery_ids[0], lease_seconds)}
    ids = list(delivery_ids)
    leases = {}
    for did, attempt_id, number, rung, token, timestamp, endpoint_id, digest in _rows(
        _START, [ids, [uuid.uuid4() for _ in ids], float(lease_seconds)]
    ):
        lease = Lease(
            int(did),
            int(attempt_id),
            int(number),
            int(rung),
            uuid.UUID(str(token)),
            int(timestamp),
            endpoint_id,
            digest,
        )
        leases[lease.delivery_id] = lease
    missing = set(ids) - set(leases)
    if missing:
        raise RuntimeError(
            f"start_attempts: deliveries {sorted(missing)} are not pending (the caller must hold their locks)"
        )
    return leases


@dataclass(frozen=True)
class Outcome:
    """One attempt's outcome, as :func:`record_outcomes` writes it."""

    lease: Lease
    attempt_state: str
    delivery_state: str
    delay: float | None
    status_code: int | None
    excerpt: str
    error: str
    payload_sha256: str | None
    duration_ms: int | None


# A batch's outcomes as the CTE ``p`` of attempt_sql.RECORD_FROM_P (the reason: one for all).
_RECORD = (
    """
WITH p AS (
    SELECT *, %s::text AS reason
      FROM unnest(%s::text[], %s::float8[], %s::text[], %s::int[], %s::bigint[], %s::uuid[], %s::text[],
                  %s::text[], %s::text[], %s::int[], %s::bigint[], %s::text[])
        AS u(state, delay, digest, status, id, token, attempt_state, excerpt, error, duration, attempt, stale_error)
)"""
    + attempt_sql.RECORD_FROM_P
)


def record_outcomes(outcomes: Sequence[Outcome]) -> list[bool]:
    """Write each outcome, fenced on its lease; per outcome, whether its delivery moved
    (False: the lease was gone, the attempt is ``stale`` and its answer discarded)."""
    if len(outcomes) == 1:
        o = outcomes[0]
        recorded = attempt_sql.record_outcome(
            o.lease,
            attempt_state=o.attempt_state,
            delivery_state=o.delivery_state,
            delay=o.delay,
            status_code=o.status_code,
            excerpt=o.excerpt,
            error=o.error,
            payload_sha256=o.payload_sha256,
            duration_ms=o.duration_ms,
        )
        return [not recorded.stale]
    columns: list[list] = [[] for _ in range(12)]
    # In delivery order: the statement locks the deliveries in the order of its rows.
    for o in sorted(outcomes, key=lambda o: (o.lease.delivery_id, o.lease.attempt_id)):
        for column, value in zip(
            columns,
            (
                str(o.delivery_state),
                float(o.delay or 0.0),
                o.payload_sha256,
                o.status_code,
                o.lease.delivery_id,
                o.lease.token,
                str(o.attempt_state),
                _bounded(o.excerpt, EXCERPT_MAX),
                _bounded(o.error, ERROR_MAX),
                o.duration_ms,
                o.lease.attempt_id,
                attempt_sql.stale_error(o.status_code, o.error),
            ),
            strict=True,
        ):
            column.append(value)
    moved = {int(r[0]) for r in _rows(_RECORD, [CANCELLED_ENDPOINT_DELETED, *columns])}
    return [o.lease.attempt_id in moved for o in outcomes]  # by attempt: two leases of one delivery stay apart


def endpoints_deleted_for(delivery_ids: Sequence[int]) -> set[int]:
    """Those of ``delivery_ids`` whose endpoint has been deleted (as committed now)."""
    if len(delivery_ids) == 1:
        return set(delivery_ids) if attempt_sql.endpoint_deleted_for(delivery_ids[0]) else set()
    return {
        int(r[0])
        for r in _rows(
            "SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id"
            " WHERE d.id = ANY(%s::bigint[]) AND e.deleted_at IS NOT NULL",
            [list(delivery_ids)],
        )
    }


# The endpoint's due pending deliveries beside one just begun, longest-waiting first, locked
# for a carried batch (webhooks.services.carrying); SKIP LOCKED passes over one another
# batch or begin is claiming. Only while the endpoint is live (not deleted, not disabled):
# those deliveries are left to their own jobs, which end or hold them. Served by
# webhook_deliveries_ep_due (endpoint_id, next_attempt_at WHERE state = 'pending'); the
# endpoint by primary key.
_DUE_BESIDE = """
SELECT d.id FROM webhook_deliveries d
 WHERE d.endpoint_id = %s::text AND d.state = 'pending' AND d.next_attempt_at <= now() AND d.id <> %s::bigint
   AND EXISTS (SELECT 1 FROM webhook_endpoints e
                WHERE e.id = d.endpoint_id AND e.deleted_at IS NULL AND e.disabled_at IS NULL)
 ORDER BY d.next_attempt_at, d.id
 LIMIT %s::int
   FOR UPDATE OF d SKIP LOCKED
"""


def lock_due_beside(endpoint_id: str, delivery_id: int, limit: int) -> list[int]:
    """Up to ``limit`` of the endpoint's due deliveries other than ``delivery_id``, locked,
    in the caller's transaction."""
    return [int(r[0]) for r in _rows(_DUE_BESIDE, [endpoint_id, int(delivery_id), int(limit)])]
