"""The gauges read from the database, refreshed by the worker (every few seconds, on its
maintenance thread) and by the web process's ``/metrics`` (at each scrape).

Both processes serve them so that a rule still sees the queue, the dead letters and the
worker count when no worker is left to scrape: every target reports the same database, so
aggregate them with ``max``, never ``sum``. Every read is cheap (a partial index, a small
table, the catalog; each statement says which) and every label is bounded: kinds, queues,
rails, states and table names, never a merchant or a receiver's host.
"""

from __future__ import annotations

from django.conf import settings

from charges import gauge_sql as charge_sql
from charges import metrics as charge_metrics
from jobs.primitives import breaker_gauges
from jobs.storage import gauge_sql as job_sql
from jobs.storage import health_sql
from vpay import metrics
from webhooks import gauge_sql as webhook_sql
from webhooks import metrics as webhook_metrics

# A worker beats every 5 s by default (`--heartbeat`); one silent for 30 s has missed six
# beats, and its leases (two beats plus 2 s) have long run out.
WORKER_LIVE_WITHIN = 30.0
# The failed-deliveries gauge's window: the day an operator has to tell a merchant.
DELIVERIES_FAILED_WINDOW = 86400.0
# The tables whose growth is worth watching: the queue's, and the evidence that accumulates.
WATCHED_TABLES = (
    "jobs",
    "processed_jobs",
    "dead_letters",
    "alerts",
    "events",
    "webhook_deliveries",
    "webhook_delivery_attempts",
    "provider_requests",
    "charges",
    "payment_intents",
    "checkout_sessions",
    "api_idempotency_records",
    "customers",
    "refunds",
    "oauth_assertion_jtis",
    "oauth_access_tokens",
)


def refresh() -> None:
    """Read every database gauge now. A database error propagates (the callers log it and
    keep serving the last values)."""
    breaker_gauges.refresh()
    refresh_queue()
    refresh_operator_backlog()
    refresh_tables()


def refresh_queue() -> None:
    metrics.OLDEST_CLAIMABLE_AGE.set(health_sql.oldest_claimable_age())
    metrics.QUEUE_DEPTH.clear()
    for queue, kind, claimable, leased, _total in health_sql.depth():
        metrics.QUEUE_DEPTH.labels(queue=queue, kind=kind, state="claimable").set(claimable)
        metrics.QUEUE_DEPTH.labels(queue=queue, kind=kind, state="leased").set(leased)
    metrics.WORKERS_LIVE.set(job_sql.workers_live(WORKER_LIVE_WITHIN))


def refresh_operator_backlog() -> None:
    """What waits for a human, and what would hurt if it waited too long."""
    rows = job_sql.dead_letters_pending()
    metrics.DEAD_LETTERS_PENDING.clear()
    for kind, count, _age in rows:
        metrics.DEAD_LETTERS_PENDING.labels(kind=kind).set(count)
    metrics.DEAD_LETTERS_OLDEST_PENDING_JOB_AGE.set(max((age for _k, _c, age in rows), default=0.0))

    ttl = float(settings.VPAY_PROCESSED_JOBS_TTL_SECONDS)
    metrics.PROCESSED_JOBS_TTL.set(ttl)
    fenced, left = job_sql.fenced_live_jobs()
    metrics.FENCED_LIVE_JOBS.set(fenced)
    metrics.FENCED_LIVE_JOBS_TTL_LEFT.set(ttl if left is None else left)

    charge_metrics.CHARGES_LIVE.clear()
    for rail, state, count in charge_sql.live_by_rail_and_state():
        charge_metrics.CHARGES_LIVE.labels(rail=rail, state=state).set(count)

    pending, oldest = webhook_sql.pending_fan_out()
    webhook_metrics.EVENTS_PENDING_FAN_OUT.set(pending)
    webhook_metrics.EVENTS_PENDING_FAN_OUT_AGE.set(oldest)
    webhook_metrics.EVENTS_ABANDONED_PENDING.set(webhook_sql.abandoned_events())
    webhook_metrics.DELIVERIES_PENDING.set(webhook_sql.pending_deliveries())
    failed = webhook_sql.failed_recently(DELIVERIES_FAILED_WINDOW)
    for state in ("exhausted", "refused"):  # always both: a rule should read 0, not nothing
        webhook_metrics.DELIVERIES_FAILED_RECENTLY.labels(state=state).set(failed.get(state, 0))


def refresh_tables() -> None:
    metrics.TABLE_BYTES.clear()
    metrics.TABLE_ROWS.clear()
    for table, size, rows in job_sql.table_sizes(WATCHED_TABLES):
        metrics.TABLE_BYTES.labels(table=table).set(size)
        metrics.TABLE_ROWS.labels(table=table).set(rows)
