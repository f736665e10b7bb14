"""The SQL of endpoint health and of disabling/enabling an endpoint (``webhooks.services.endpoint_health``).

Every age is the database's: the evidence is read as spans and ages computed from
``now()``, and every state change is a compare-and-swap whose WHERE repeats the premises
of the decision that asked for it, so a success, a re-enable or a delete committed since
the evidence was read makes it match nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

# A receiver failure (webhooks.health_decisions): it answered non-2xx, or did not answer.
RECEIVER_FAILED = "(a.state = 'no_response' OR (a.state = 'failed' AND a.status_code IS NOT NULL))"

# A successful attempt of endpoint e started at or after %(since)s. The endpoint's recently
# touched deliveries (webhook_deliveries_ep_recent: every attempt moves updated_at), then
# their attempts (webhook_attempts_delivery_number).
_SUCCEEDED_SINCE = (
    "EXISTS (SELECT 1 FROM webhook_deliveries d JOIN webhook_delivery_attempts a ON a.delivery_id = d.id"
    " WHERE d.endpoint_id = e.id AND d.updated_at >= %(since)s AND a.started_at >= %(since)s"
    " AND a.state = 'succeeded')"
)


def _rows(sql: str, params) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def endpoints_page(after: tuple | None, limit: int) -> list[tuple]:
    """Enabled, live endpoints in id order, after ``after`` (a keyset of ``(id,)``)."""
    keyset = "AND id > %s" if after else ""
    # Primary key order; webhook_endpoints is small (at most 16 live per merchant).
    return _rows(
        f"SELECT id FROM webhook_endpoints WHERE deleted_at IS NULL AND disabled_at IS NULL {keyset}"
        " ORDER BY id LIMIT %s",
        [*(after or ()), limit],
    )


@dataclass(frozen=True)
class Streak:
    first_at: datetime
    """The streak's first receiver failure (the CAS guards are written against it)."""
    span_seconds: float
    warned_seconds_ago: float | None


# The endpoint's current failing streak within the lookback (webhooks.health_decisions),
# from its recently touched deliveries (webhook_deliveries_ep_recent) and their attempts.
_STREAK = f"""
WITH scope AS (
    SELECT e.id, e.health_warned_at,
           GREATEST(e.health_since, now() - make_interval(secs => %(lookback)s)) AS since
      FROM webhook_endpoints e
     WHERE e.id = %(id)s AND e.deleted_at IS NULL AND e.disabled_at IS NULL
),
tried AS (
    SELECT a.state, a.status_code, a.started_at
      FROM scope s
      JOIN webhook_deliveries d ON d.endpoint_id = s.id AND d.updated_at >= s.since
      JOIN webhook_delivery_attempts a ON a.delivery_id = d.id AND a.started_at >= s.since
),
streak AS (
    SELECT min(a.started_at) AS first_at, max(a.started_at) AS last_at
      FROM tried a
     WHERE {RECEIVER_FAILED}
       AND a.started_at > COALESCE((SELECT max(t.started_at) FROM tried t WHERE t.state = 'succeeded'), '-infinity')
)
SELECT streak.first_at,
       EXTRACT(EPOCH FROM streak.last_at - streak.first_at)::float8,
       CASE WHEN s.health_warned_at >= streak.first_at
            THEN EXTRACT(EPOCH FROM now() - s.health_warned_at)::float8 END
  FROM scope s, streak
 WHERE streak.first_at IS NOT NULL
"""


def current_streak(endpoint_id: str, lookback_seconds: float) -> Streak | None:
    """The endpoint's failing streak, or None (healthy, disabled, deleted, or no evidence)."""
    rows = _rows(_STREAK, {"id": endpoint_id, "lookback": lookback_seconds})
    return Streak(*rows[0]) if rows else None


def mark_warned(endpoint_id: str, streak_first_at: datetime) -> str | None:
    """CAS: record the streak's warning; the merchant id for the one caller that made it.

    Guarded on what the warning is about: still live and enabled, not re-enabled since the
    streak began, not yet warned for this streak, and nothing succeeded since it began."""
    # The endpoint by primary key; the success probe as _SUCCEEDED_SINCE says.
    rows = _rows(
        "UPDATE webhook_endpoints e SET health_warned_at = now()"
        " WHERE e.id = %(id)s AND e.deleted_at IS NULL AND e.disabled_at IS NULL"
        " AND e.health_since <= %(since)s"
        " AND (e.health_warned_at IS NULL OR e.health_warned_at < %(since)s)"
        f" AND NOT {_SUCCEEDED_SINCE} RETURNING e.merchant_id",
        {"id": endpoint_id, "since": streak_first_at},
    )
    return rows[0][0] if rows else None


def disable_failing(
    endpoint_id: str, streak_first_at: datetime, *, half_window_seconds: float, reason: str
) -> str | None:
    """CAS: disable the endpoint for its failing streak; the merchant id, or None.

    The decision's premises, repeated on the row as it is now: enabled and live, warned
    for this streak at least half a window ago (database clock; a re-enable clears the
    warning, so an endpoint re-enabled since cannot match), and nothing succeeded since
    the streak began."""
    # The endpoint by primary key; the success probe as _SUCCEEDED_SINCE says.
    rows = _rows(
        "UPDATE webhook_endpoints e SET disabled_at = now(), disabled_reason = %(reason)s, disabled_by = 'vpay'"
        " WHERE e.id = %(id)s AND e.deleted_at IS NULL AND e.disabled_at IS NULL"
        " AND e.health_warned_at >= %(since)s"
        " AND e.health_warned_at <= now() - make_interval(secs => %(half)s)"
        f" AND NOT {_SUCCEEDED_SINCE} RETURNING e.merchant_id",
        {"id": endpoint_id, "since": streak_first_at, "half": half_window_seconds, "reason": reason},
    )
    return rows[0][0] if rows else None


def disable(endpoint_id: str, *, reason: str, actor: str) -> str | None:
    """CAS enabled → disabled (a merchant's or an operator's choice); the merchant id, or None."""
    # The endpoint by primary key.
    rows = _rows(
        "UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = %s, disabled_by = %s"
        " WHERE id = %s AND deleted_at IS NULL AND disabled_at IS NULL RETURNING merchant_id",
        [reason, actor, endpoint_id],
    )
    return rows[0][0] if rows else None


def enable(endpoint_id: str) -> tuple[str, list[int]] | None:
    """CAS disabled → enabled with a fresh health record; its pending deliveries are made
    due now. ``(merchant id, pending delivery ids)``, or None when it was not disabled.

    The pending deliveries are locked first (id order, by endpoint: webhook_deliveries_ep_due),
    before the endpoint: the order an attempt takes them in, so an enable never deadlocks
    with an attempt or a delete."""
    # Lock the endpoint's pending deliveries (webhook_deliveries_ep_due).
    _rows(
        "SELECT id FROM webhook_deliveries WHERE endpoint_id = %s AND state = 'pending' ORDER BY id FOR UPDATE",
        [endpoint_id],
    )
    # The endpoint by primary key.
    rows = _rows(
        "UPDATE webhook_endpoints SET disabled_at = NULL, disabled_reason = '', disabled_by = '',"
        " health_since = now(), health_warned_at = NULL"
        " WHERE id = %s AND deleted_at IS NULL AND disabled_at IS NOT NULL RETURNING merchant_id",
        [endpoint_id],
    )
    if not rows:
        return None
    # Its held deliveries, due now (webhook_deliveries_ep_due); each keeps its place on its ladder.
    resumed = _rows(
        "UPDATE webhook_deliveries SET next_attempt_at = now(), updated_at = now()"
        " WHERE endpoint_id = %s AND state = 'pending' RETURNING id",
        [endpoint_id],
    )
    return rows[0][0], sorted(r[0] for r in resumed)
