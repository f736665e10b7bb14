"""The bulk operation "resend every delivery that failed in a time window" (after an outage).

Each item is one :func:`webhooks.services.resend.resend_delivery` (CAS from a failed state
back to pending with a fresh ladder, and its deliver job), in the unit's transaction. The
window is on ``completed_at`` (when the delivery failed for good), anchored on the
operation's ``created_at`` for relative bounds, so it is drawn on the database clock.
"""

from __future__ import annotations

from datetime import datetime

from jobs.bulk_models import BulkOperationKind
from jobs.primitives.bulk_sql import Envelope
from jobs.primitives.expansion import BulkOp, BulkRefused, ItemOutcome, register_operation
from webhooks.models import DeliveryState
from webhooks.services.resend import resend_delivery

FAILED_STATES = (DeliveryState.EXHAUSTED.value, DeliveryState.REFUSED.value)

# Which failed deliveries the filter matches: completed_at in [since, until), relative
# bounds back from the anchor `b.created_at` (the envelope's created_at on expansion, the
# statement's now() on a preview).
WINDOW_START = "coalesce(%(since_at)s::timestamptz, b.created_at - make_interval(secs => %(since_seconds)s))"
WINDOW_END = "coalesce(%(until_at)s::timestamptz, b.created_at - make_interval(secs => coalesce(%(until_seconds)s, 0)))"
MATCH_SQL = f"""
       d.state = ANY(%(states)s)
   AND d.completed_at >= {WINDOW_START}
   AND d.completed_at < {WINDOW_END}
   AND (%(endpoints)s::text[] IS NULL OR d.endpoint_id = ANY(%(endpoints)s))
"""

# The next failed deliveries after the cursor, in id order (the primary key; the failed
# states are a small share of the table, filtered on the way).
PAGE_SQL = f"""
SELECT d.id
  FROM webhook_deliveries d JOIN bulk_operations b ON b.id = %(op)s
 WHERE d.id > %(cursor)s AND {MATCH_SQL}
 ORDER BY d.id
 LIMIT %(limit)s
"""

# How many match now, and the window as the database clock draws it (the confirmation
# page's count and its refusal of an empty window). A scan of the failed deliveries, as the
# expansion's: no index serves completed_at, and an operator's preview is rare.
PREVIEW_SQL = f"""
SELECT count(d.id), {WINDOW_START}, {WINDOW_END}
  FROM (SELECT statement_timestamp() AS created_at) b LEFT JOIN webhook_deliveries d ON {MATCH_SQL}
 GROUP BY b.created_at
"""

FILTER_KEYS = ("states", "since_seconds", "since_at", "until_seconds", "until_at", "endpoints")


def _instant(filter: dict, key: str) -> str | None:
    value = filter.get(key)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise BulkRefused(f"{key} must be an ISO-8601 time") from None
    if parsed.tzinfo is None:
        raise BulkRefused(f"{key} needs a timezone")
    return value


def _seconds(filter: dict, key: str) -> float | None:
    value = filter.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
        raise BulkRefused(f"{key} must be a non-negative number of seconds")
    return value


def filter_params(filter: dict) -> dict:
    unknown = set(filter) - set(FILTER_KEYS)
    if unknown:
        raise BulkRefused(f"unknown delivery filter {', '.join(sorted(unknown))}")
    states = filter.get("states") or list(FAILED_STATES)
    if not isinstance(states, list) or not set(states) <= set(FAILED_STATES):
        raise BulkRefused(f"states must be among {', '.join(FAILED_STATES)}")
    params = {
        "states": states,
        "since_seconds": _seconds(filter, "since_seconds"),
        "since_at": _instant(filter, "since_at"),
        "until_seconds": _seconds(filter, "until_seconds"),
        "until_at": _instant(filter, "until_at"),
        "endpoints": filter.get("endpoints") or None,
    }
    if params["since_seconds"] is None and params["since_at"] is None:
        raise BulkRefused("a resend needs the start of its window (since)")
    _refuse_an_empty_window(params)
    return params


def _refuse_an_empty_window(params: dict) -> None:
    """Bounds of the same sort compare without a clock; a duration against an instant needs
    the database's now (the preview's window, ``jobs.services.bulk.bulk_operation_preview``)."""
    since_s, until_s = params["since_seconds"], params["until_seconds"]
    if since_s is not None and params["until_at"] is None and since_s <= (until_s or 0):
        raise BulkRefused("the window is empty: since must be further back than until")
    since_at, until_at = params["since_at"], params["until_at"]
    if since_at and until_at and datetime.fromisoformat(since_at) >= datetime.fromisoformat(until_at):
        raise BulkRefused("the window is empty: since must be before until")


def resend_one(delivery_id: int, env: Envelope) -> ItemOutcome:
    states = filter_params(env.filter)["states"]
    reason = f"bulk operation #{env.id}" + (f": {env.reason}" if env.reason else "")
    if resend_delivery(delivery_id, actor=env.user_id, states=states, reason=reason):
        return ItemOutcome(True)
    return ItemOutcome(False, "not in a failed state any more (resent already, or on its way)")


RESEND_DELIVERIES = register_operation(BulkOp(BulkOperationKind.RESEND_DELIVERIES, PAGE_SQL, filter_params, resend_one, PREVIEW_SQL))
