"""The bulk operation "replay every pending dead letter matching a filter".

Each item is one :func:`jobs.services.dead_letters.dead_letter_replay`: same ``job_id``,
same guards (the fence horizon unless forced, a live job, an unknown kind), one letter per
transaction. Only letters created up to the operation's submit are matched, so a replayed
job that dead-letters again is not replayed again by the same operation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobs.bulk_models import BulkOperationKind
from jobs.primitives.bulk_sql import Envelope
from jobs.primitives.expansion import BulkOp, BulkRefused, ItemOutcome, register_operation
from jobs.services import dead_letters as ops

# Which pending letters the filter matches, relative to the anchor `b.created_at`: the
# envelope's created_at on expansion (a resumed expansion matches what the first page
# would have), the statement's now() on a preview.
MATCH_SQL = """
       d.state = 'pending_review'
   AND d.created_at <= b.created_at
   AND (%(kinds)s::text[] IS NULL OR d.kind = ANY(%(kinds)s))
   AND (%(queues)s::text[] IS NULL OR d.queue = ANY(%(queues)s))
   AND (%(causes)s::text[] IS NULL OR d.cause = ANY(%(causes)s))
   AND (%(since_seconds)s::float8 IS NULL OR d.created_at >= b.created_at - make_interval(secs => %(since_seconds)s))
   AND (%(since_at)s::timestamptz IS NULL OR d.created_at >= %(since_at)s)
"""

# The next page of pending letters after the cursor, in id order (jobs_deadletter_pending_id).
PAGE_SQL = f"""
SELECT d.id
  FROM dead_letters d JOIN bulk_operations b ON b.id = %(op)s
 WHERE d.id > %(cursor)s AND {MATCH_SQL}
 ORDER BY d.id
 LIMIT %(limit)s
"""

# How many pending letters match now, and since when (the confirmation page's count; the
# pending letters through jobs_deadletter_pending_id).
PREVIEW_SQL = f"""
SELECT count(d.id),
       coalesce(%(since_at)s::timestamptz, b.created_at - make_interval(secs => %(since_seconds)s)),
       b.created_at
  FROM (SELECT statement_timestamp() AS created_at) b LEFT JOIN dead_letters d ON {MATCH_SQL}
 GROUP BY b.created_at
"""

FILTER_KEYS = ("kinds", "queues", "causes", "since_seconds", "since_at")


def filter_params(filter: dict) -> dict:
    """The stored filter as the page's parameters (absent or empty: no filter on that)."""
    unknown = set(filter) - set(FILTER_KEYS)
    if unknown:
        raise BulkRefused(f"unknown dead letter filter {', '.join(sorted(unknown))}")
    params: dict[str, Any] = {}
    for key in ("kinds", "queues", "causes"):
        values = filter.get(key) or None
        if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
            raise BulkRefused(f"{key} must be a list of strings")
        params[key] = values
    since_seconds = filter.get("since_seconds")
    if since_seconds is not None and (isinstance(since_seconds, bool) or not isinstance(since_seconds, int | float)):
        raise BulkRefused("since_seconds must be a number")
    params["since_seconds"] = since_seconds
    since_at = filter.get("since_at")
    if since_at is not None:
        try:
            parsed = datetime.fromisoformat(since_at)
        except (TypeError, ValueError):
            raise BulkRefused("since_at must be an ISO-8601 time") from None
        if parsed.tzinfo is None:
            raise BulkRefused("since_at needs a timezone")
    params["since_at"] = since_at
    return params


def replay_one(letter_id: int, env: Envelope) -> ItemOutcome:
    result = ops.dead_letter_replay(
        letter_id=letter_id, actor=env.requested_by, force=bool(env.options.get("force")), user_id=env.user_id
    )
    return ItemOutcome(result.done, "" if result.done else f"{result.refusal}: {result.message}")


REPLAY_DEAD_LETTERS = register_operation(
    BulkOp(BulkOperationKind.REPLAY_DEAD_LETTERS, PAGE_SQL, filter_params, replay_one, PREVIEW_SQL)
)
