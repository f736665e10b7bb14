"""The bulk operation "resend every delivery that failed in a time window" (after an outage).

Each item is one :func:`webhooks.services.resend.resend_delivery` (CAS from a failed state
back to pending with a fresh ladder, and its deliver job), in the unit's transaction. The
window is on ``completed_at`` (when the delivery failed for good), anchored on the
operation's ``created_at`` for relative bounds, so it is drawn on the database clock.
"""

from __future__ import annotations

from datetime import datetime

from jobs.bulk_models import BulkOperationKind
from jobs.bulk_sql import Envelope
from jobs.expansion import BulkOp, BulkRefused, ItemOutcome, register_operation
from webhooks.models import DeliveryState
from webhooks.services.resend import resend_delivery

FAILED_STATES = (DeliveryState.EXHAUSTED.value, DeliveryState.REFUSED.value)

# The next failed deliveries after the cursor, in id order (the primary key; the failed
# states are a small share of the table, filtered on the way).
PAGE_SQL = """
SELECT d.id
  FROM webhook_deliveries d JOIN bulk_operations b ON b.id = %(op)s
 WHERE d.id > %(cursor)s
   AND d.state = ANY(%(states)s)
   AND d.completed_at >= coalesce(%(since_at)s::timestamptz, b.created_at - make_interval(secs => %(since_seconds)s))
   AND d.completed_at < coalesce(%(until_at)s::timestamptz,
                                 b.created_at - make_interval(secs => coalesce(%(until_seconds)s, 0)))
   AND (%(endpoints)s::text[] IS NULL OR d.endpoint_id = ANY(%(endpoints)s))
 ORDER BY d.id
 LIMIT %(limit)s
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
    return params


def resend_one(delivery_id: int, env: Envelope) -> ItemOutcome:
    states = filter_params(env.filter)["states"]
    if resend_delivery(delivery_id, actor=env.user_id, states=states):
        return ItemOutcome(True)
    return ItemOutcome(False, "not in a failed state any more (resent already, or on its way)")


RESEND_DELIVERIES = register_operation(BulkOp(BulkOperationKind.RESEND_DELIVERIES, PAGE_SQL, filter_params, resend_one))
