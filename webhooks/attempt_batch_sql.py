"""The SQL of a batch of delivery attempts (``webhooks.services.delivery``'s group commits):
the read of what they send, the claim under the deliveries' and their endpoints' row locks,
and the fenced record of their outcomes, each a statement for the whole batch. A batch of
one takes :mod:`webhooks.attempt_sql`'s single-row statements instead: planned once per
connection on a primary key, they cost less than these at one row (and most batches are one
row when the worker is not busy). Every instant is the database's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection

from vpay.pipelined import execute_pipelined
from webhooks import attempt_sql
from webhooks.attempt_sql import DeliveryRow, Lease, Loaded, _bool, _float, _uuid
from webhooks.models import Event
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
# A statement inside the caller's transaction also waits at most LOCK_TIMEOUT for a row lock:
# a batch stalled on one contended row would stall every executor in it, so it fails instead
# and each request runs again alone (jobs.primitives.group_commit), waiting only for itself.
# Values come back typed; on the plain path (queries captured, prepared statements off behind
# a pooler) as Django's cursor returns them: the readers take both.
_GENERIC = b"SET LOCAL plan_cache_mode = force_generic_plan"
LOCK_TIMEOUT = b"SET LOCAL lock_timeout = '2s'"
_RESET = (b"SET LOCAL plan_cache_mode TO DEFAULT", b"SET LOCAL lock_timeout TO DEFAULT")
_NAMED: dict[str, str] = {}


def _rows(sql: str, params: Sequence) -> list[tuple]:
    """``sql`` (``%s`` placeholders) run with a generic plan (above); its rows."""
    named = _NAMED.get(sql)
    if named is None:
        named = _NAMED[sql] = _name_placeholders(sql)
    values = {f"p{i}": value for i, value in enumerate(params, start=1)}
    if connection.in_atomic_block:
        rows = execute_pipelined(named, values, before=(_GENERIC, LOCK_TIMEOUT), after=_RESET, in_transaction=True)
    else:
        rows = execute_pipelined(named, values, before=(b"BEGIN", _GENERIC), after=(b"COMMIT",), in_transaction=False)
    if rows is None:
        with connection.cursor() as cursor:
            cursor.execute(named, values)
            return cursor.fetchall() if cursor.description else []
    return rows


def _name_placeholders(sql: str) -> str:
    parts = sql.split("%s")
    return parts[0] + "".join(f"%(p{i})s{part}" for i, part in enumerate(parts[1:], start=1))


# Everything the attempts of a batch send, in one read (hand-written: the ORM's compile of
# this join cost more CPU than the rest of an attempt). Served by the primary keys of the
# deliveries, their endpoints and events, and ``webhook_secrets_endpoint``. Sealed secrets are
# sealed tokens (a prefix, then URL-safe base64): a space never occurs in one.
_LOAD = """
SELECT d.id, d.event_id, d.endpoint_id, e.url, e.deleted_at IS NOT NULL,
       ev.merchant_id, ev.type, ev.data::text, ev.api_version,
       to_char(ev.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
       array_to_string(ARRAY(
           SELECT s.sealed FROM webhook_secrets s
            WHERE s.endpoint_id = d.endpoint_id AND (s.expires_at IS NULL OR s.expires_at > now())
            ORDER BY s.created_at, s.id), ' ')
  FROM webhook_deliveries d
  JOIN webhook_endpoints e ON e.id = d.endpoint_id
  JOIN events ev ON ev.id = d.event_id
 WHERE d.id = ANY(%s::bigint[])
"""


def load_deliveries(delivery_ids: Sequence[int]) -> dict[int, Loaded]:
    """The deliveries of ``delivery_ids`` that exist, with what their attempts send."""
    if len(delivery_ids) == 1:
        one = attempt_sql.load_delivery(delivery_ids[0])
        return {one.id: one} if one is not None else {}
    loaded = {}
    for (
        did,
        event_id,
        endpoint_id,
        url,
        deleted,
        merchant_id,
        type_,
        data,
        version,
        created_at,
        sealed,
    ) in _rows(_LOAD, [list(delivery_ids)]):
        # The event as the ORM would load it: data decoded from the stored JSON text, the instant in UTC.
        event = Event(
            id=event_id,
            merchant_id=merchant_id,
            type=type_,
            data=json.loads(data),
            api_version=version,
            created_at=datetime.fromisoformat(created_at).replace(tzinfo=UTC),
        )
        loaded[int(did)] = Loaded(int(did), event_id, endpoint_id, url, _bool(deleted), event, sealed.split())
    return loaded


# The deliveries, locked FOR UPDATE in id order (every batch takes its locks in one order),
# with their endpoints read, not locked (the cap check locks those, after the deliveries:
# one lock order). Primary keys of both.
_LOCK = """
SELECT d.id, d.endpoint_id, d.event_id, d.state, d.attempts, d.ladder_base,
       EXTRACT(EPOCH FROM d.next_attempt_at - now())::float8,
       EXTRACT(EPOCH FROM d.lease_expires_at - now())::float8,
       d.lease_token, d.payload_sha256,
       e.deleted_at IS NOT NULL, e.disabled_at IS NOT NULL, e.merchant_id
  FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
 WHERE d.id = ANY(%s::bigint[]) ORDER BY d.id FOR UPDATE OF d
"""


def lock_deliveries(delivery_ids: Sequence[int]) -> dict[int, DeliveryRow]:
    """Those of ``delivery_ids`` that exist, locked (MUST run in a transaction)."""
    if len(delivery_ids) == 1:
        row = attempt_sql.lock_delivery(delivery_ids[0])
        return {row.id: row} if row is not None else {}
    rows = {}
    for found in _rows(_LOCK, [sorted(delivery_ids)]):
        did, endpoint_id, event_id, state, attempts, base, due_in, lease_left, token, digest = found[:10]
        deleted, disabled, merchant = found[10:]
        rows[int(did)] = DeliveryRow(
            int(did),
            endpoint_id,
            event_id,
            state,
            int(attempts),
            int(base),
            float(due_in),
            _float(lease_left),
            _uuid(token),
            digest,
            _bool(deleted),
            _bool(disabled),
            merchant,
        )
    return rows


def in_flight_for_endpoints(endpoint_ids: Sequence[str]) -> dict[str, tuple[int, float | None]]:
    """Per endpoint: the attempts holding a live lease, counted under the endpoint's row lock
    so two workers cannot both take the last slot, and the seconds until the earliest of
    those leases expires (the latest a slot can stay taken; None: no live lease). MUST run
    in a transaction."""
    if len(set(endpoint_ids)) == 1:
        return {endpoint_ids[0]: attempt_sql.in_flight_for_endpoint(endpoint_ids[0])}
    ordered = sorted(set(endpoint_ids))
    # The locks (primary key, in id order), then the count (the partial index
    # webhook_deliveries_in_flight), as two statements: a statement reads one snapshot, taken
    # when it starts, so a count in the lock's own statement would not see the attempt
    # committed by the worker whose lock it waited for (tests/test_webhook_fast_path.py).
    _rows("SELECT 1 FROM webhook_endpoints WHERE id = ANY(%s::text[]) ORDER BY id FOR NO KEY UPDATE", [ordered])
    counted = {
        endpoint: (int(n), _float(earliest))
        for endpoint, n, earliest in _rows(
            "SELECT endpoint_id, count(*), EXTRACT(EPOCH FROM min(lease_expires_at) - now())::float8"
            " FROM webhook_deliveries WHERE endpoint_id = ANY(%s::text[]) AND state = 'delivering'"
            " AND lease_expires_at > now() GROUP BY endpoint_id",
            [ordered],
        )
    }
    return {endpoint: counted.get(endpoint, (0, None)) for endpoint in ordered}


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


# Each outcome fenced on its lease, in one statement: a delivery moves only if that lease is
# still the delivery's and has not expired (primary key); its attempt (primary key) is then
# recorded as heard, or marked stale if the delivery did not move. Only an attempt nobody has
# ended yet is written: one already abandoned by the recovery keeps that first terminal
# state. ``payload_sha256`` is COALESCEd: the first digest of a body that may have left stays.
_RECORD = """
WITH p AS (
    SELECT * FROM unnest(%s::text[], %s::float8[], %s::text[], %s::int[], %s::bigint[], %s::uuid[], %s::text[],
                         %s::text[], %s::text[], %s::int[], %s::bigint[], %s::text[])
        AS p(state, delay, digest, status, id, token, attempt_state, excerpt, error, duration, attempt, stale_error)
), moved AS (
    UPDATE webhook_deliveries d
       SET state = p.state, lease_token = NULL, lease_expires_at = NULL,
           next_attempt_at = CASE WHEN p.state = 'pending'
                                  THEN now() + make_interval(secs => p.delay)
                                  ELSE d.next_attempt_at END,
           payload_sha256 = COALESCE(d.payload_sha256, p.digest),
           last_status_code = p.status, updated_at = now(),
           completed_at = CASE WHEN p.state <> 'pending' THEN now() END,
           cancel_reason = CASE WHEN p.state = 'cancelled' THEN %s::text ELSE d.cancel_reason END
      FROM p
     WHERE d.id = p.id AND d.state = 'delivering' AND d.lease_token = p.token
       AND d.lease_expires_at > now()
    RETURNING p.attempt
), heard AS (
    UPDATE webhook_delivery_attempts a
       SET state = p.attempt_state, status_code = p.status, response_excerpt = p.excerpt,
           error = p.error, duration_ms = p.duration, finished_at = now()
      FROM p
     WHERE a.id = p.attempt AND a.state = 'in_flight' AND p.attempt IN (SELECT attempt FROM moved)
), stale AS (
    UPDATE webhook_delivery_attempts a
       SET state = 'stale', finished_at = now(), duration_ms = p.duration, error = p.stale_error
      FROM p
     WHERE a.id = p.attempt AND a.state = 'in_flight' AND p.attempt NOT IN (SELECT attempt FROM moved)
)
SELECT attempt FROM moved
"""


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
    for o in outcomes:
        heard = f"heard {o.status_code}" if o.status_code is not None else "no answer"
        stale_error = f"lease expired before the answer was recorded; answer discarded ({heard}). {o.error}"
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
                _bounded(stale_error, ERROR_MAX),
            ),
            strict=True,
        ):
            column.append(value)
    moved = {int(r[0]) for r in _rows(_RECORD, [*columns, CANCELLED_ENDPOINT_DELETED])}
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
