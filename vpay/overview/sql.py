"""The overview's reads: one statement each, every age and window on the database clock.

The last hour is cut into ``BUCKETS`` buckets of ``BUCKET_SECONDS``, oldest first, ending at
``now()``; a bucket is ``[start, end)``, except the newest, which is open-ended: a row
written after this transaction began (its own clock reading a little later) still counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db import connection

BUCKETS = 12
BUCKET_SECONDS = 300
FAILED_ATTEMPTS = ("failed", "no_response", "abandoned")


def _rows(sql: str, params: dict | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or {})
        return cursor.fetchall()


@dataclass(frozen=True, slots=True)
class KindDepth:
    kind: str
    claimable: int
    scheduled: int
    leased: int
    oldest_claimable_seconds: float


# Depth and oldest claimable age by kind. The jobs table holds only live work, so this is a
# scan of what is waiting (as jobs.storage.health_sql.queue_summary, by kind only).
_QUEUE_BY_KIND = """
SELECT kind,
       count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now()),
       count(*) FILTER (WHERE locked_at IS NULL AND run_at > now()),
       count(*) FILTER (WHERE locked_at IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE locked_at IS NULL AND run_at <= now())), 0)::float8
  FROM jobs GROUP BY kind ORDER BY kind
"""


def queue_by_kind() -> list[KindDepth]:
    return [KindDepth(*row) for row in _rows(_QUEUE_BY_KIND)]


# Webhook attempts per bucket, succeeded and failed (an answer that was not 2xx, no answer,
# or a worker that died mid-attempt), by when they started (webhook_attempts_started_brin).
# A succeeded attempt ends its delivery, so the first column is also deliveries succeeded.
_ATTEMPTS_BY_BUCKET = """
SELECT b.i,
       count(a.id) FILTER (WHERE a.state = 'succeeded'),
       count(a.id) FILTER (WHERE a.state = ANY(%(failed)s))
  FROM generate_series(0, %(buckets)s - 1) AS b(i)
  LEFT JOIN webhook_delivery_attempts a
    ON a.started_at >= now() - make_interval(secs => %(width)s * (%(buckets)s - b.i))
   AND (b.i = %(buckets)s - 1 OR a.started_at < now() - make_interval(secs => %(width)s * (%(buckets)s - b.i - 1)))
 GROUP BY b.i ORDER BY b.i
"""


def attempts_by_bucket() -> list[tuple[int, int]]:
    """(succeeded, failed) per bucket, oldest first."""
    params = {"failed": list(FAILED_ATTEMPTS), "buckets": BUCKETS, "width": BUCKET_SECONDS}
    return [(ok, failed) for _, ok, failed in _rows(_ATTEMPTS_BY_BUCKET, params)]


@dataclass(frozen=True, slots=True)
class FailingEndpoint:
    endpoint_id: str
    host: str  # the URL's host only: merchants put tokens in paths, queries and userinfo
    failures: int
    last_failure_seconds_ago: float


# Endpoints whose every attempt in the last hour failed (none succeeded), most failures
# first: attempts by start time (webhook_attempts_started_brin), their delivery and endpoint
# by primary key.
_FAILING_ENDPOINTS = """
SELECT d.endpoint_id, e.url, count(*),
       extract(epoch FROM now() - max(a.started_at))::float8
  FROM webhook_delivery_attempts a
  JOIN webhook_deliveries d ON d.id = a.delivery_id
  JOIN webhook_endpoints e ON e.id = d.endpoint_id
 WHERE a.started_at >= now() - make_interval(secs => %(window)s)
   AND a.state = ANY(%(states)s)
 GROUP BY d.endpoint_id, e.url
HAVING count(*) FILTER (WHERE a.state = 'succeeded') = 0
 ORDER BY count(*) DESC, d.endpoint_id
 LIMIT %(limit)s
"""


def failing_endpoints(limit: int = 10) -> list[FailingEndpoint]:
    params = {"window": BUCKETS * BUCKET_SECONDS, "states": ["succeeded", *FAILED_ATTEMPTS], "limit": limit}
    return [
        FailingEndpoint(endpoint_id, _host(url), failures, ago)
        for endpoint_id, url, failures, ago in _rows(_FAILING_ENDPOINTS, params)
    ]


def _host(url: str) -> str:
    parts = urlsplit(url)
    return (parts.hostname or "?") + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True, slots=True)
class RailUnresolved:
    rail: str
    unresolved: int
    new_in_window: int
    oldest_seconds: float


# Unresolved charges by rail, with how many became unresolved in the last hour and how long
# the oldest has been (charges_live_idx: unresolved is one of the live states it covers).
_UNRESOLVED = """
SELECT rail, count(*),
       count(*) FILTER (WHERE unresolved_at >= now() - make_interval(secs => %(window)s)),
       coalesce(extract(epoch FROM now() - min(unresolved_at)), 0)::float8
  FROM charges WHERE status = 'unresolved'
 GROUP BY rail ORDER BY count(*) DESC, rail
"""


def unresolved_charges() -> list[RailUnresolved]:
    return [RailUnresolved(*row) for row in _rows(_UNRESOLVED, {"window": BUCKETS * BUCKET_SECONDS})]


# Dead letters pending review by kind (jobs_deadletter_review_idx, state first).
_PENDING_BY_KIND = """
SELECT kind, count(*) FROM dead_letters WHERE state = 'pending_review' GROUP BY kind ORDER BY count(*) DESC, kind
"""


def dead_letters_pending_by_kind() -> list[tuple[str, int]]:
    return _rows(_PENDING_BY_KIND)


# Pending dead letters by the bucket they were created in (jobs_deadletter_review_idx:
# state, then created_at in the window).
_NEW_PENDING_BY_BUCKET = """
SELECT b.i, count(d.id)
  FROM generate_series(0, %(buckets)s - 1) AS b(i)
  LEFT JOIN dead_letters d
    ON d.state = 'pending_review'
   AND d.created_at >= now() - make_interval(secs => %(width)s * (%(buckets)s - b.i))
   AND (b.i = %(buckets)s - 1 OR d.created_at < now() - make_interval(secs => %(width)s * (%(buckets)s - b.i - 1)))
 GROUP BY b.i ORDER BY b.i
"""


def new_dead_letters_by_bucket() -> list[int]:
    return [n for _, n in _rows(_NEW_PENDING_BY_BUCKET, {"buckets": BUCKETS, "width": BUCKET_SECONDS})]


# The instant the page was drawn at, as the database tells it.
def database_now():
    return _rows("SELECT now()")[0][0]
