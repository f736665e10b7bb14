"""The webhooks app's PostgreSQL: every statement that needs row locks, ``now()`` or a
compare-and-swap lives here, so the services read as the protocol they implement.

Every instant is the database's: leases, due times and the signature's timestamp are all
computed from ``now()`` (or ``clock_timestamp()``) in SQL, never from a worker's clock.
"""

from __future__ import annotations

from django.db import connection

from vpay.pipelined import fetch_prepared

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


# --- fan-out ------------------------------------------------------------------------------


def pending_event_ids(limit: int, *, failed_before: bool = False) -> list[str]:
    """The oldest pending events (the partial index ``events_pending_fan_out`` serves this);
    ``failed_before``: only those whose fan-out has failed before (``events_pending_failed_before``)."""
    if failed_before:
        sql = (
            "SELECT id FROM events WHERE fan_out = 'pending'"
            " AND (fan_out_failures > 0 OR fan_out_transient_failures > 0) ORDER BY created_at, id LIMIT %s"
        )
    else:
        sql = "SELECT id FROM events WHERE fan_out = 'pending' ORDER BY created_at, id LIMIT %s"
    return [r[0] for r in _rows(sql, [limit])]


# The fan-out's row locks. A page: the oldest pending events whose fan-out never failed
# (the partial index ``events_pending_fan_out`` serves the order; one that failed goes one
# per transaction, so an event that keeps failing cannot fail every page). Named events: by
# primary key. SKIP LOCKED either way: an event another drain holds is passed over.
# The fan-out's statements are prepared and planned generic (vpay.pipelined.fetch_prepared):
# each takes its page as an array, or a LIMIT, and was planned again at every page.
_LOCK_PENDING_PAGE = """
SELECT id FROM events
 WHERE fan_out = 'pending' AND fan_out_failures = 0 AND fan_out_transient_failures = 0
 ORDER BY created_at, id LIMIT %(limit)s::int FOR UPDATE SKIP LOCKED
"""
_LOCK_PENDING_EVENTS = """
SELECT id FROM events WHERE id = ANY(%(events)s::text[]) AND fan_out = 'pending'
 ORDER BY created_at, id FOR UPDATE SKIP LOCKED
"""

# The deliveries of locked events, in one statement whatever their number: each event's
# merchant, type and ``data->>'id'`` read from its row (primary key), its merchant's
# endpoints through ``webhook_endpoints_live``; ``webhook_deliveries_event_endpoint``
# absorbs a re-run. Then every delivery of those events (the same unique index), with the
# event's merchant for its deliver job's tenant.
_CREATE_DELIVERIES = """
INSERT INTO webhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at, updated_at)
SELECT ev.id, e.id, 'pending', 0, now(), now(), now()
  FROM events ev
  JOIN webhook_endpoints e ON e.merchant_id = ev.merchant_id
 WHERE ev.id = ANY(%(events)s::text[]) AND e.deleted_at IS NULL AND e.disabled_at IS NULL
   AND CASE WHEN ev.type = 'webhook_endpoint.test'
            THEN e.id = ev.data->>'id'
            ELSE (e.enabled_events @> ARRAY['*']::varchar[] OR e.enabled_events @> ARRAY[ev.type]::varchar[])
                 AND NOT (starts_with(ev.type, 'webhook_endpoint.') AND e.id = ev.data->>'id')
       END
 ORDER BY ev.created_at, ev.id, e.id
ON CONFLICT (event_id, endpoint_id) DO NOTHING
"""
_DELIVERIES_OF_EVENTS = """
SELECT d.id, d.event_id, ev.merchant_id
  FROM webhook_deliveries d JOIN events ev ON ev.id = d.event_id
 WHERE d.event_id = ANY(%(events)s::text[])
 ORDER BY d.id
"""


def lock_pending_page(limit: int) -> list[str]:
    """Up to ``limit`` of the oldest pending events nobody else holds, row-locked. MUST run
    in the fan-out's transaction."""
    return [r[0] for r in fetch_prepared(_LOCK_PENDING_PAGE, {"limit": limit}, generic=True)]


def lock_pending_events(event_ids: list[str]) -> list[str]:
    """Those of ``event_ids`` still pending and held by nobody else, row-locked (another
    drain's, or one done, are left out). MUST run in the fan-out's transaction."""
    return [r[0] for r in fetch_prepared(_LOCK_PENDING_EVENTS, {"events": event_ids}, generic=True)]


def create_deliveries(event_ids: list[str]) -> list[tuple[int, str, str]]:
    """One delivery per live, enabled endpoint of the event's merchant subscribed to its
    type (or ``*``), for each of the (locked) events; returns every delivery of those events
    as ``(id, event_id, merchant_id)``. A re-run creates nothing. An event about an endpoint
    (``webhook_endpoint.*``) goes to the merchant's *other* endpoints: the one it is about
    is failing or disabled. Except a test (``webhook_endpoint.test``): it goes to the one
    endpoint it is about, and only there, whatever that endpoint subscribes to."""
    fetch_prepared(_CREATE_DELIVERIES, {"events": event_ids}, generic=True)
    return fetch_prepared(_DELIVERIES_OF_EVENTS, {"events": event_ids}, generic=True)


_MARK_FANNED_OUT = """
WITH moved AS (
    UPDATE events SET fan_out = 'fanned_out' WHERE id = ANY(%(events)s::text[]) AND fan_out = 'pending' RETURNING 1
)
SELECT count(*) FROM moved
"""


def mark_fanned_out(event_ids: list[str]) -> int:
    """CAS ``pending → fanned_out`` (primary key); how many matched (fewer: another drain
    got there first)."""
    ((moved,),) = fetch_prepared(_MARK_FANNED_OUT, {"events": event_ids}, generic=True)
    return moved


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


CANCELLED_ENDPOINT_DELETED = "the endpoint was deleted before this delivery was made; nothing more is sent"
# An operator cancelled the delivery's job (webhooks/migrations/0014_operator_cancel.py
# writes it). The merchant reads this text (GET .../deliveries): who and why stay on the
# job's dead letter, for operators.
CANCELLED_BY_OPERATOR = "cancelled by an operator before it was delivered; nothing more is sent"


def cancel_pending_for_endpoint(endpoint_id: str, reason: str = CANCELLED_ENDPOINT_DELETED) -> int:
    """Every ``pending`` delivery of the endpoint → ``cancelled`` with ``reason`` (its
    delete's transaction). ``delivering`` ones are left to their attempt; the next begin
    cancels them. Returns how many were cancelled.

    The rows are locked in id order first (``webhook_deliveries_ep_due`` finds them, the
    sort orders them), the order a batch of attempts locks its deliveries in
    (``webhooks.attempt_batch_sql``): locked in the index's due order instead, a delete and a
    batch holding two of its deliveries could each wait for the other."""
    return _rowcount(
        "WITH locked AS (SELECT id FROM webhook_deliveries WHERE endpoint_id = %s AND state = 'pending'"
        " ORDER BY id FOR UPDATE)"
        " UPDATE webhook_deliveries d SET state = 'cancelled', cancel_reason = %s, completed_at = now(),"
        " updated_at = now() FROM locked WHERE d.id = locked.id AND d.state = 'pending'",
        [endpoint_id, _bounded(reason, 300)],
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
