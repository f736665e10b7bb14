"""The SQL of one delivery attempt: the read of what it sends, the claim under the
delivery's and the endpoint's row locks, and the fenced record of its outcome (the
protocol is ``webhooks/services/delivery.py``'s). Every attempt runs these, so each step
is as few statements as its locks allow (a count that must see what the lock's previous
holder committed is a statement of its own), and the hot ones are prepared
(``vpay.prepared``: planned once per connection instead of on every call).

Every instant is the database's: leases, due times and the signature's timestamp are
computed from ``now()`` (or ``clock_timestamp()``) in SQL.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction
from psycopg import sql

from vpay.pipelined import execute_pipelined, fetch_prepared
from vpay.prepared import execute_prepared
from webhooks.models import Event
from webhooks.repository import CANCELLED_ENDPOINT_DELETED, ERROR_MAX, EXCERPT_MAX, _bounded, _rowcount, _rows

# Values come back from execute_prepared as text, or typed where it falls back to Django's
# cursor (while queries are captured, or with prepared statements off behind a pooler):
# these take both.


def _float(value) -> float | None:
    return None if value is None else float(value)


def _bool(value) -> bool:
    return value is True or value == "t"


def _uuid(value) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(str(value))


@dataclass(frozen=True)
class Loaded:
    """What an attempt sends: the delivery's event, its endpoint's URL and signing secrets."""

    id: int
    event_id: str
    endpoint_id: str
    endpoint_url: str
    endpoint_deleted: bool
    event: Event
    sealed_secrets: list[str]  # sealed, still signing now, in configuration (creation) order

    def __repr__(self) -> str:  # the sealed secrets stay out of every repr
        return f"<Loaded delivery {self.id} event {self.event_id} endpoint {self.endpoint_id}>"


# Everything an attempt sends, by delivery: the delivery, its endpoint's URL, its event and
# the endpoint's secrets still signing now (primary keys, webhook_secrets_endpoint). The
# WHERE names the deliveries: one here, a batch's in attempt_batch_sql.
LOAD_SELECT = """
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
"""


def load_delivery(delivery_id: int) -> Loaded | None:
    """One read of everything an attempt sends (hand-written and prepared: the ORM's compile
    of this join cost more CPU than the rest of an attempt). Served by the primary keys of
    the delivery, its endpoint and its event, and ``webhook_secrets_endpoint``. Sealed
    secrets are sealed tokens (a prefix, then URL-safe base64): a space never occurs in one."""
    row = execute_prepared(LOAD_SELECT + " WHERE d.id = %s::bigint", [delivery_id])
    return None if row is None else loaded_from(row)


def loaded_from(row: tuple) -> Loaded:
    """A :class:`Loaded` from a row of this read's columns (``attempt_batch_sql``'s too)."""
    did, event_id, endpoint_id, url, deleted, merchant_id, type_, data, version, created_at, sealed = row
    # The event as the ORM would load it: data decoded from the stored JSON text, the instant in UTC.
    event = Event(
        id=event_id,
        merchant_id=merchant_id,
        type=type_,
        data=json.loads(data),
        api_version=version,
        created_at=datetime.fromisoformat(created_at).replace(tzinfo=UTC),
    )
    return Loaded(int(did), event_id, endpoint_id, url, _bool(deleted), event, sealed.split())


@dataclass(frozen=True)
class DeliveryRow:
    """A delivery as ``begin_attempt`` sees it, locked."""

    id: int
    endpoint_id: str
    event_id: str
    state: str
    attempts: int
    ladder_base: int
    due_in: float  # seconds until next_attempt_at (<= 0: due)
    lease_left: float | None  # seconds of the current lease left (<= 0: expired)
    lease_token: uuid.UUID | None
    payload_sha256: str | None
    endpoint_deleted: bool
    endpoint_disabled: bool = False
    merchant_id: str = ""


# A delivery as a claim decides on it (the endpoint read, not locked: the cap check locks
# it, after the delivery: one lock order). The WHERE and the lock follow: one delivery here,
# a batch's in attempt_batch_sql.
LOCK_SELECT = """
SELECT d.id, d.endpoint_id, d.event_id, d.state, d.attempts, d.ladder_base,
       EXTRACT(EPOCH FROM d.next_attempt_at - now())::float8,
       EXTRACT(EPOCH FROM d.lease_expires_at - now())::float8,
       d.lease_token, d.payload_sha256,
       e.deleted_at IS NOT NULL, e.disabled_at IS NOT NULL, e.merchant_id
  FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
"""


def lock_delivery(delivery_id: int) -> DeliveryRow | None:
    """The delivery, locked ``FOR UPDATE`` (MUST run in a transaction); the endpoint row
    is read, not locked (the cap check locks it, after the delivery: one lock order).
    Primary keys of both; prepared."""
    row = execute_prepared(LOCK_SELECT + " WHERE d.id = %s::bigint FOR UPDATE OF d", [delivery_id])
    return None if row is None else delivery_row_from(row)


def delivery_row_from(row: tuple) -> DeliveryRow:
    """A :class:`DeliveryRow` from a row of this lock's columns (``attempt_batch_sql``'s too)."""
    (
        did,
        endpoint_id,
        event_id,
        state,
        attempts,
        base,
        due_in,
        lease_left,
        token,
        digest,
        deleted,
        disabled,
        merchant,
    ) = row
    return DeliveryRow(
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


# The endpoint's row lock (primary key), then, as a statement of its own so its snapshot is
# taken after the lock is granted (tests/test_webhook_fast_path.py), its live leases
# (webhook_deliveries_in_flight) and due deliveries (webhook_deliveries_ep_due, at most one
# past ``beginning``). One round trip where it may be (vpay.pipelined): the lock is held to the
# commit, and the endpoint's other deliveries queue behind every round trip it waits for. The
# lock names the endpoint as a quoted literal: vpay.pipelined sends one prepared statement.
_LOCK_ENDPOINT = "SELECT 1 FROM webhook_endpoints WHERE id = {endpoint}::text FOR NO KEY UPDATE"
_IN_FLIGHT = (
    "SELECT count(*), EXTRACT(EPOCH FROM min(lease_expires_at) - now())::float8,"
    " (SELECT count(*) FROM (SELECT FROM webhook_deliveries p WHERE p.endpoint_id = %(endpoint)s::text"
    " AND p.state = 'pending' AND p.next_attempt_at <= now() LIMIT %(due_limit)s::int) due)"
    " FROM webhook_deliveries WHERE endpoint_id = %(endpoint)s::text AND state = 'delivering' AND lease_expires_at > now()"
)


def in_flight_for_endpoint(endpoint_id: str, beginning: int = 0) -> tuple[int, float | None, int]:
    """Attempts holding a live lease on this endpoint, counted under the endpoint's row lock
    so two workers cannot both take the last slot, and the seconds until the earliest of
    those leases expires (the latest a slot can stay taken; None: no live lease); and its due
    ``pending`` deliveries, counted up to one more than the ``beginning`` its caller is
    about to begin (theirs among them: a batch could carry the others). MUST run in a
    transaction."""
    params: dict[str, str | int] = {"endpoint": endpoint_id, "due_limit": beginning + 1}
    lock = _LOCK_ENDPOINT.format(endpoint=sql.Literal(endpoint_id).as_string(None))
    with transaction.mark_for_rollback_on_error():
        rows = execute_pipelined(_IN_FLIGHT, params, before=(lock.encode(),), in_transaction=True)
        if rows is None:
            with connection.cursor() as cursor:
                cursor.execute(lock)
                cursor.execute(_IN_FLIGHT, params)
                rows = cursor.fetchall()
    count, earliest, due = rows[0]
    return int(count), _float(earliest), int(due)


def waiting_deliveries(endpoint_id: str, limit: int) -> list[int]:
    """The endpoint's due ``pending`` deliveries, longest-waiting first (the ones a freed
    slot should go to). Served by ``webhook_deliveries_ep_due`` (its predicate is the
    statement's literal, so the generic plan uses it too); planned generic for its
    ``LIMIT``, which had it planned again at every hand-off (bench/WEBHOOKS.md)."""
    rows = fetch_prepared(
        "SELECT id FROM webhook_deliveries WHERE endpoint_id = %(endpoint)s::text AND state = 'pending'"
        " AND next_attempt_at <= now() ORDER BY next_attempt_at, id LIMIT %(limit)s::int",
        {"endpoint": endpoint_id, "limit": limit},
        generic=True,
    )
    return [int(i) for (i,) in rows]


@dataclass(frozen=True)
class Lease:
    """A claimed attempt: the attempt row exists (``in_flight``) and was committed before sending."""

    delivery_id: int
    attempt_id: int
    number: int  # the attempt's number over the delivery's life (the header says it)
    rung: int  # its place on the current ladder (after a resend the ladder starts over)
    token: uuid.UUID
    timestamp: int  # the signature's t: the database clock, in whole seconds
    endpoint_id: str = ""
    # The digest of the first body that may have been sent, as read under the row lock that
    # claimed this attempt: what the attempt's body must hash to (None: nothing sent yet).
    payload_sha256: str | None = None


def start_attempt(delivery_id: int, lease_seconds: float) -> Lease:
    """``pending → delivering`` with a fresh lease, and the attempt row written, in the
    caller's transaction (the caller checked due-ness and the cap under the same locks)."""
    token = uuid.uuid4()
    # One prepared statement: the delivery moves (primary key, already locked by the caller)
    # and its attempt row is written from what the move returned.
    row = execute_prepared(
        """
        WITH p(token, lease, id) AS (VALUES (%s::uuid, %s::float8, %s::bigint)),
        moved AS (
            UPDATE webhook_deliveries d
               SET state = 'delivering', attempts = attempts + 1, lease_token = p.token,
                   lease_expires_at = now() + make_interval(secs => p.lease), updated_at = now()
              FROM p
             WHERE d.id = p.id AND d.state = 'pending'
         RETURNING d.id, d.attempts, d.attempts - d.ladder_base AS rung, d.endpoint_id, d.payload_sha256
        ), attempt AS (
            INSERT INTO webhook_delivery_attempts
                   (delivery_id, number, lease_token, state, started_at, response_excerpt, error)
            SELECT moved.id, moved.attempts, p.token, 'in_flight', now(), '', '' FROM moved, p
            RETURNING id
        )
        SELECT attempt.id, moved.attempts, moved.rung, floor(EXTRACT(EPOCH FROM clock_timestamp()))::bigint,
               moved.endpoint_id, moved.payload_sha256
          FROM moved, attempt
        """,
        [token, float(lease_seconds), delivery_id],
    )
    if row is None:
        raise RuntimeError(f"start_attempt: delivery {delivery_id} is not pending (its caller must hold its lock)")
    attempt_id, number, rung, timestamp, endpoint_id, digest = row
    return Lease(delivery_id, int(attempt_id), int(number), int(rung), token, int(timestamp), endpoint_id, digest)


@dataclass(frozen=True)
class Recorded:
    """What ``record_outcome`` did: ``stale`` when the lease was gone and the answer discarded."""

    stale: bool
    delivery_state: str | None = None


# The record of outcomes, after a CTE ``p`` of them (state, delay, digest, status, id, token,
# reason, attempt_state, excerpt, error, duration, attempt, stale_error): one row here, a
# batch's in attempt_batch_sql. Each fenced on its lease: a delivery moves only if that
# lease is still the delivery's and has not expired (primary key); its attempt (primary key)
# is then recorded as heard, or marked stale if the delivery did not move; matched by
# attempt, so two leases of one delivery stay apart. Only an attempt nobody has ended yet
# is written: one already abandoned by the recovery keeps that first terminal state.
# ``payload_sha256`` is COALESCEd: the first digest of a body that may have left stays.
# Answers the attempts whose delivery moved.
RECORD_FROM_P = """
, moved AS (
    UPDATE webhook_deliveries d
       SET state = p.state, lease_token = NULL, lease_expires_at = NULL,
           next_attempt_at = CASE WHEN p.state = 'pending'
                                  THEN now() + make_interval(secs => p.delay)
                                  ELSE d.next_attempt_at END,
           payload_sha256 = COALESCE(d.payload_sha256, p.digest),
           last_status_code = p.status, updated_at = now(),
           completed_at = CASE WHEN p.state <> 'pending' THEN now() END,
           cancel_reason = CASE WHEN p.state = 'cancelled' THEN p.reason ELSE d.cancel_reason END
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


def stale_error(status_code: int | None, error: str) -> str:
    """What a stale attempt's row says: its answer, discarded."""
    heard = f"heard {status_code}" if status_code is not None else "no answer"
    return _bounded(f"lease expired before the answer was recorded; answer discarded ({heard}). {error}", ERROR_MAX)


def record_outcome(
    lease: Lease,
    *,
    attempt_state: str,
    delivery_state: str,
    delay: float | None,
    status_code: int | None,
    excerpt: str,
    error: str,
    payload_sha256: str | None,
    duration_ms: int | None,
) -> Recorded:
    """Write one attempt's outcome, fenced on its lease: the delivery moves only if this
    lease is still the delivery's and has not expired. Otherwise the attempt is marked
    ``stale`` (if it is still ``in_flight``: an attempt the recovery already ``abandoned``
    stays so) and nothing else changes: a late answer never records success.

    ``payload_sha256`` is COALESCEd: the first digest of a body that may have left stays.
    """
    # One prepared statement (no savepoint, no second round trip): RECORD_FROM_P over this
    # one outcome.
    row = execute_prepared(
        "WITH p(state, delay, digest, status, id, token, reason, attempt_state, excerpt, error, duration, attempt,"
        " stale_error) AS (VALUES (%s::text, %s::float8, %s::text, %s::int, %s::bigint, %s::uuid, %s::text,"
        " %s::text, %s::text, %s::text, %s::int, %s::bigint, %s::text))" + RECORD_FROM_P,
        [
            str(delivery_state),
            float(delay or 0.0),
            payload_sha256,
            status_code,
            lease.delivery_id,
            lease.token,
            CANCELLED_ENDPOINT_DELETED,
            str(attempt_state),
            _bounded(excerpt, EXCERPT_MAX),
            _bounded(error, ERROR_MAX),
            duration_ms,
            lease.attempt_id,
            stale_error(status_code, error),
        ],
    )
    return Recorded(False, delivery_state) if row is not None else Recorded(True)


def recover_lease(row: DeliveryRow, next_state: str) -> None:
    """An expired lease, found under the delivery's lock: its attempt becomes ``abandoned``
    and the delivery ``pending`` (due now: the failure was ours, not the receiver's),
    ``exhausted``, or ``cancelled`` (its endpoint was deleted meanwhile). MUST run in the
    transaction that locked ``row``."""
    _rowcount(
        "UPDATE webhook_delivery_attempts SET state = 'abandoned', finished_at = now(),"
        " error = 'lease expired before an answer was recorded (worker died or stalled)'"
        " WHERE delivery_id = %s AND lease_token = %s AND state = 'in_flight'",
        [row.id, row.lease_token],
    )
    _rowcount(
        "UPDATE webhook_deliveries SET state = %s, lease_token = NULL, lease_expires_at = NULL,"
        " next_attempt_at = now(), updated_at = now(),"
        " completed_at = CASE WHEN %s <> 'pending' THEN now() END,"
        " cancel_reason = CASE WHEN %s = 'cancelled' THEN %s ELSE cancel_reason END"
        " WHERE id = %s AND state = 'delivering' AND lease_token = %s",
        [next_state, next_state, next_state, CANCELLED_ENDPOINT_DELETED, row.id, row.lease_token],
    )


def endpoint_deleted_for(delivery_id: int) -> bool:
    """Whether the delivery's endpoint has been deleted (as committed now)."""
    rows = _rows(
        "SELECT e.deleted_at IS NOT NULL FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id"
        " WHERE d.id = %s",
        [delivery_id],
    )
    return bool(rows and rows[0][0])
