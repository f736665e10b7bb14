"""The webhooks app's PostgreSQL: every statement that needs row locks, ``now()`` or a
compare-and-swap lives here, so the services read as the protocol they implement.

Every instant is the database's: leases, due times and the signature's timestamp are all
computed from ``now()`` (or ``clock_timestamp()``) in SQL, never from a worker's clock.
"""

from __future__ import annotations

from django.db import connection

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
