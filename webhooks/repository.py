"""The webhooks app's PostgreSQL: every statement that needs row locks, ``now()`` or a
compare-and-swap lives here, so the services read as the protocol they implement.

Every instant is the database's: leases, due times and the signature's timestamp are all
computed from ``now()`` (or ``clock_timestamp()``) in SQL, never from a worker's clock.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection

from vpay.prepared import execute_prepared
from webhooks.models import Event

EXCERPT_MAX = 4096
ERROR_MAX = 2000


def _bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, NUL-free: Postgres ``text`` refuses U+0000, and
    an excerpt or error that cannot be stored would leave the attempt unrecorded (and the
    delivery re-sent every time its lease expired)."""
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rows(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _rowcount(sql: str, params=None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _one_prepared(sql: str, params: list) -> tuple | None:
    """The first row of a hot statement, run prepared (``vpay.prepared``: planned once per
    connection; the attempt's statements were planned afresh on every call, which cost the
    server more than running them). Values come back as text, or typed where it falls back
    to Django's cursor: read them with the converters below, which take both."""
    return execute_prepared(sql, params)


def _int(value) -> int | None:
    return None if value is None else int(value)


def _float(value) -> float | None:
    return None if value is None else float(value)


def _bool(value) -> bool:
    return value is True or value == "t"


def _uuid(value) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(str(value))


# --- fan-out ------------------------------------------------------------------------------


def pending_event_ids(limit: int) -> list[str]:
    """The oldest pending events (the partial index ``events_pending_fan_out`` serves this)."""
    return [
        r[0]
        for r in _rows(
            "SELECT id FROM events WHERE fan_out = 'pending' ORDER BY created_at, id LIMIT %s",
            [limit],
        )
    ]


def lock_pending_event(event_id: str) -> tuple[str, str] | None:
    """``(merchant_id, type)`` of the event, row-locked, if it is still pending and nobody
    else holds it; None otherwise (a concurrent drain has it, or it is done). MUST run in
    the event's transaction."""
    rows = _rows(
        "SELECT merchant_id, type FROM events WHERE id = %s AND fan_out = 'pending' FOR UPDATE SKIP LOCKED",
        [event_id],
    )
    return rows[0] if rows else None


def create_deliveries(event_id: str, merchant_id: str, event_type: str) -> list[tuple[int, str]]:
    """One delivery per live, enabled endpoint of the merchant subscribed to ``event_type``
    (or ``*``); returns every delivery of the event as ``(id, endpoint_id)``. A re-run
    creates nothing: ``webhook_deliveries_event_endpoint`` absorbs it. An event about an
    endpoint (``webhook_endpoint.*``) goes to the merchant's *other* endpoints: the one it
    is about is failing or disabled. Except a test (``webhook_endpoint.test``): it goes to
    the one endpoint it is about, and only there, whatever that endpoint subscribes to."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_deliveries
                   (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
            SELECT %(event)s, e.id, 'pending', 0, now(), now(), now()
              FROM webhook_endpoints e
             WHERE e.merchant_id = %(merchant)s AND e.deleted_at IS NULL AND e.disabled_at IS NULL
               AND CASE WHEN %(type)s = 'webhook_endpoint.test'
                        THEN e.id = (SELECT ev.data->>'id' FROM events ev WHERE ev.id = %(event)s)
                        ELSE (e.enabled_events @> ARRAY['*']::varchar[]
                              OR e.enabled_events @> ARRAY[%(type)s]::varchar[])
                             AND NOT (starts_with(%(type)s, 'webhook_endpoint.')
                                      AND e.id = (SELECT ev.data->>'id' FROM events ev WHERE ev.id = %(event)s))
                   END
             ORDER BY e.id
            ON CONFLICT (event_id, endpoint_id) DO NOTHING
            """,
            {"event": event_id, "merchant": merchant_id, "type": event_type},
        )
        cursor.execute(
            "SELECT id, endpoint_id FROM webhook_deliveries WHERE event_id = %s ORDER BY id",
            [event_id],
        )
        return cursor.fetchall()


def mark_fanned_out(event_id: str) -> bool:
    """CAS ``pending → fanned_out``; False means another drain got there first."""
    return _rowcount("UPDATE events SET fan_out = 'fanned_out' WHERE id = %s AND fan_out = 'pending'", [event_id]) == 1


def count_fan_out_failure(event_id: str) -> int | None:
    """Count one failed pass, in its own statement (the failed transaction rolled back, and
    a counter inside it would have rolled back too). None: the event is no longer pending."""
    rows = _rows(
        "UPDATE events SET fan_out_failures = fan_out_failures + 1"
        " WHERE id = %s AND fan_out = 'pending' RETURNING fan_out_failures",
        [event_id],
    )
    return rows[0][0] if rows else None


def count_transient_fan_out_failure(event_id: str) -> tuple[int, int] | None:
    """Count one pass that failed transiently, in its own statement (like
    :func:`count_fan_out_failure`, by primary key); ``(transient failures, re-drives)``, or
    None: the event is no longer pending."""
    rows = _rows(
        "UPDATE events SET fan_out_transient_failures = fan_out_transient_failures + 1"
        " WHERE id = %s AND fan_out = 'pending' RETURNING fan_out_transient_failures, fan_out_redrives",
        [event_id],
    )
    return rows[0] if rows else None


def mark_abandoned(event_id: str) -> int | None:
    """CAS ``pending → abandoned``; for the one caller that made the transition, the
    event's re-drive count (its alert key names it); None for everyone else."""
    rows = _rows(
        "UPDATE events SET fan_out = 'abandoned' WHERE id = %s AND fan_out = 'pending' RETURNING fan_out_redrives",
        [event_id],
    )
    return rows[0][0] if rows else None


def redrive_event(event_id: str) -> bool:
    """CAS ``abandoned → pending`` with its failure counts reset (an operator's re-drive)."""
    return (
        _rowcount(
            "UPDATE events SET fan_out = 'pending', fan_out_failures = 0, fan_out_transient_failures = 0,"
            " fan_out_redrives = fan_out_redrives + 1 WHERE id = %s AND fan_out = 'abandoned'",
            [event_id],
        )
        == 1
    )


def reopen_delivery(delivery_id: int, states: list[str]) -> str | None:
    """CAS ``<one of states> → pending`` with a fresh ladder (``ladder_base`` = the attempts
    so far), due now; the endpoint's merchant id (the deliver job's tenant), or None if it
    was in none of ``states``."""
    rows = _rows(
        "UPDATE webhook_deliveries d SET state = 'pending', ladder_base = attempts, next_attempt_at = now(),"
        " completed_at = NULL, updated_at = now() WHERE id = %s AND state = ANY(%s)"
        " RETURNING (SELECT e.merchant_id FROM webhook_endpoints e WHERE e.id = d.endpoint_id)",
        [delivery_id, states],
    )
    return rows[0][0] if rows else None


# --- one delivery attempt ----------------------------------------------------------------


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


def load_delivery(delivery_id: int) -> Loaded | None:
    """One read of everything an attempt sends (hand-written and prepared: the ORM's compile
    of this join cost more CPU than the rest of an attempt). Served by the primary keys of
    the delivery, its endpoint and its event, and ``webhook_secrets_endpoint``. Sealed
    secrets are Fernet tokens (URL-safe base64): a space never occurs in one."""
    row = _one_prepared(
        """
        SELECT d.id, d.event_id, d.endpoint_id, e.url, e.deleted_at IS NOT NULL,
               ev.merchant_id, ev.type, ev.data::text,
               to_char(ev.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
               array_to_string(ARRAY(
                   SELECT s.sealed FROM webhook_secrets s
                    WHERE s.endpoint_id = d.endpoint_id AND (s.expires_at IS NULL OR s.expires_at > now())
                    ORDER BY s.created_at, s.id), ' ')
          FROM webhook_deliveries d
          JOIN webhook_endpoints e ON e.id = d.endpoint_id
          JOIN events ev ON ev.id = d.event_id
         WHERE d.id = %s::bigint
        """,
        [delivery_id],
    )
    if row is None:
        return None
    did, event_id, endpoint_id, url, deleted, merchant_id, type_, data, created_at, sealed = row
    # The event as the ORM would load it: data decoded from the stored JSON text, the instant in UTC.
    event = Event(
        id=event_id,
        merchant_id=merchant_id,
        type=type_,
        data=json.loads(data),
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


def lock_delivery(delivery_id: int) -> DeliveryRow | None:
    """The delivery, locked ``FOR UPDATE`` (MUST run in a transaction); the endpoint row
    is read, not locked (the cap check locks it, after the delivery: one lock order).
    Primary keys of both; prepared."""
    row = _one_prepared(
        """
        SELECT d.id, d.endpoint_id, d.event_id, d.state, d.attempts, d.ladder_base,
               EXTRACT(EPOCH FROM d.next_attempt_at - now())::float8,
               EXTRACT(EPOCH FROM d.lease_expires_at - now())::float8,
               d.lease_token, d.payload_sha256,
               e.deleted_at IS NOT NULL, e.disabled_at IS NOT NULL
          FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
         WHERE d.id = %s::bigint FOR UPDATE OF d
        """,
        [delivery_id],
    )
    if row is None:
        return None
    did, endpoint_id, event_id, state, attempts, base, due_in, lease_left, token, digest, deleted, disabled = row
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
    )


CANCELLED_ENDPOINT_DELETED = "the endpoint was deleted before this delivery was made; nothing more is sent"


def cancel_pending_for_endpoint(endpoint_id: str, reason: str = CANCELLED_ENDPOINT_DELETED) -> int:
    """Every ``pending`` delivery of the endpoint → ``cancelled`` with ``reason`` (its
    delete's transaction). ``delivering`` ones are left to their attempt; the next begin
    cancels them. Returns how many were cancelled."""
    return _rowcount(
        "UPDATE webhook_deliveries SET state = 'cancelled', cancel_reason = %s, completed_at = now(),"
        " updated_at = now() WHERE endpoint_id = %s AND state = 'pending'",
        [_bounded(reason, 300), endpoint_id],
    )


def cancel_pending(delivery_id: int, reason: str = CANCELLED_ENDPOINT_DELETED) -> bool:
    """CAS one delivery ``pending → cancelled`` (found pending for a deleted endpoint)."""
    return (
        _rowcount(
            "UPDATE webhook_deliveries SET state = 'cancelled', cancel_reason = %s, completed_at = now(),"
            " updated_at = now() WHERE id = %s AND state = 'pending'",
            [_bounded(reason, 300), delivery_id],
        )
        == 1
    )


def endpoint_deleted_for(delivery_id: int) -> bool:
    """Whether the delivery's endpoint has been deleted (as committed now)."""
    rows = _rows(
        "SELECT e.deleted_at IS NOT NULL FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id"
        " WHERE d.id = %s",
        [delivery_id],
    )
    return bool(rows and rows[0][0])


def in_flight_for_endpoint(endpoint_id: str) -> tuple[int, float | None]:
    """Attempts holding a live lease on this endpoint, counted under the endpoint's row lock
    so two workers cannot both take the last slot, and the seconds until the earliest of
    those leases expires (the latest a slot can stay taken; None: no live lease). MUST run
    in a transaction."""
    # One prepared statement: the CTE takes the endpoint's row lock (primary key) before the
    # count reads (the partial index webhook_deliveries_in_flight), since the count refers to it.
    count, earliest = _one_prepared(
        """
        WITH locked AS (SELECT id FROM webhook_endpoints WHERE id = %s::text FOR NO KEY UPDATE)
        SELECT count(d.id), EXTRACT(EPOCH FROM min(d.lease_expires_at) - now())::float8
          FROM locked LEFT JOIN webhook_deliveries d
            ON d.endpoint_id = locked.id AND d.state = 'delivering' AND d.lease_expires_at > now()
        """,
        [endpoint_id],
    )
    return int(count), _float(earliest)


def waiting_deliveries(endpoint_id: str, limit: int) -> list[int]:
    """The endpoint's due ``pending`` deliveries, longest-waiting first (the ones a freed
    slot should go to). Served by ``webhook_deliveries_ep_due``; prepared (one row: the ids
    as text)."""
    (ids,) = _one_prepared(
        "SELECT array_to_string(ARRAY(SELECT id FROM webhook_deliveries WHERE endpoint_id = %s::text"
        " AND state = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at, id LIMIT %s::int), ' ')",
        [endpoint_id, limit],
    )
    return [int(i) for i in ids.split()]


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
    row = _one_prepared(
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


def expired_leases(limit: int) -> list[int]:
    """Deliveries whose lease expired (a worker died or stalled mid-attempt)."""
    return [
        r[0]
        for r in _rows(
            "SELECT id FROM webhook_deliveries WHERE state = 'delivering' AND lease_expires_at <= now()"
            " ORDER BY lease_expires_at LIMIT %s",
            [limit],
        )
    ]


def due_deliveries(limit: int, overdue_seconds: float) -> list[tuple[int, str]]:
    """Pending deliveries due at least ``overdue_seconds`` ago: ``(id, merchant_id)``, the
    merchant being the deliver job's tenant. A disabled endpoint's are held, not lost.

    Served by the partial index ``webhook_deliveries_due`` (and the endpoints' primary key)."""
    return _rows(
        "SELECT d.id, e.merchant_id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id"
        " WHERE d.state = 'pending' AND d.next_attempt_at <= now() - make_interval(secs => %s)"
        " AND e.disabled_at IS NULL ORDER BY d.next_attempt_at LIMIT %s",
        [overdue_seconds, limit],
    )


@dataclass(frozen=True)
class Recorded:
    """What ``record_outcome`` did: ``stale`` when the lease was gone and the answer discarded."""

    stale: bool
    delivery_state: str | None = None


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
    heard = f"heard {status_code}" if status_code is not None else "no answer"
    # One prepared statement (no savepoint, no second round trip): the fenced move of the
    # delivery (primary key), then its attempt (primary key) recorded as heard if the
    # delivery moved, or marked stale if not. Only an attempt nobody has ended yet is
    # written: one already abandoned by the recovery keeps that first terminal state.
    (moved,) = _one_prepared(
        """
        WITH p(state, delay, digest, status, id, token, reason, attempt_state, excerpt, error, duration, attempt,
               stale_error) AS (
            VALUES (%s::text, %s::float8, %s::text, %s::int, %s::bigint, %s::uuid, %s::text, %s::text, %s::text,
                    %s::text, %s::int, %s::bigint, %s::text)
        ), moved AS (
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
            RETURNING d.id
        ), heard AS (
            UPDATE webhook_delivery_attempts a
               SET state = p.attempt_state, status_code = p.status, response_excerpt = p.excerpt,
                   error = p.error, duration_ms = p.duration, finished_at = now()
              FROM p
             WHERE a.id = p.attempt AND a.state = 'in_flight' AND EXISTS (SELECT 1 FROM moved)
        ), stale AS (
            UPDATE webhook_delivery_attempts a
               SET state = 'stale', finished_at = now(), duration_ms = p.duration, error = p.stale_error
              FROM p
             WHERE a.id = p.attempt AND a.state = 'in_flight' AND NOT EXISTS (SELECT 1 FROM moved)
        )
        SELECT EXISTS (SELECT 1 FROM moved)
        """,
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
            _bounded(f"lease expired before the answer was recorded; answer discarded ({heard}). {error}", ERROR_MAX),
        ],
    )
    return Recorded(False, delivery_state) if _bool(moved) else Recorded(True)


def active_sealed_secrets(endpoint_id: str) -> list[str]:
    """The endpoint's sealed secrets still signing now, in configuration (creation) order."""
    return [
        r[0]
        for r in _rows(
            "SELECT sealed FROM webhook_secrets WHERE endpoint_id = %s"
            " AND (expires_at IS NULL OR expires_at > now()) ORDER BY created_at, id",
            [endpoint_id],
        )
    ]


def expire_current_secrets(endpoint_id: str, overlap_seconds: float) -> int:
    """Rotation: every secret of the endpoint stops signing at ``now() + overlap_seconds``
    at the latest (an expiry computed by the database); a secret already due to expire
    earlier keeps its earlier expiry."""
    return _rowcount(
        "UPDATE webhook_secrets SET expires_at = now() + make_interval(secs => %s)"
        " WHERE endpoint_id = %s AND (expires_at IS NULL OR expires_at > now() + make_interval(secs => %s))",
        [overlap_seconds, endpoint_id, overlap_seconds],
    )
