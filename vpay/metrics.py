"""Prometheus metrics of the worker and the queue (the web process adds django-prometheus').

Counters are labelled by what an alert rule needs: kind and disposition for jobs, category
and severity for errors. Gauges that describe the queue are computed in SQL.
"""

from prometheus_client import Counter, Gauge, Histogram

from vpay.errors import Category, Severity

JOBS = Counter("vpay_jobs_total", "Claimed jobs by kind and disposition", ["kind", "disposition"])
ERROR_EVENTS = Counter("vpay_error_events_total", "Job failures by category and severity", ["category", "severity"])
ALERT_EVENTS = Counter("vpay_alert_events_total", "Log lines that carried alert=true", ["category", "severity"])
# Every category an alert is counted under, exported at 0 from each process's start: a rule's
# increase() over a series that first appears with its first increment sees no increase, so
# the first alert of a category in each process would never page (a late success, say, which
# may be the only one). The alerts' sources, then the job failures' categories
# (jobs.operator.alerts counts an alert under its error_category where it has one);
# tests/test_alert_rules.py keeps this list and the code's sources in step.
ALERT_CATEGORIES = (
    "charges.capture_lapsed",
    "charges.capture_refused",
    "charges.capture_unresolved",
    "charges.confirm",
    "charges.late_success",
    "charges.rail_configuration",
    "charges.refund_unresolved",
    "charges.unresolved",
    "charges.void_refused",
    "charges.void_unresolved",
    "jobs.sweep_step_failing",
    "webhooks.body_changed",
    "webhooks.delivery_exhausted",
    "webhooks.delivery_refused",
    "webhooks.endpoint_disabled",
    "webhooks.endpoint_failing",
    "webhooks.event_abandoned",
    "webhooks.event_stuck",
    *(category.value for category in Category),
)
for _category in ALERT_CATEGORIES:
    for _severity in Severity:
        ALERT_EVENTS.labels(category=_category, severity=_severity.value)
DUPLICATES_SKIPPED = Counter("vpay_jobs_duplicates_skipped_total", "Duplicate job_ids skipped by the fence", ["kind"])
CLAIM_FAILURES = Counter("vpay_jobs_claim_failures_total", "Claims that failed (database unreachable or erroring)")
SETTLE_FAILURES = Counter(
    "vpay_jobs_settle_failures_total", "Settle writes that failed; the lease is handed back when the database answers"
)
RUNNING_JOBS = Gauge("vpay_worker_running_jobs", "Jobs this worker's executors are running now")
# Every numeric ceiling the worker runs under (jobs.primitives.ceilings), by name.
CEILING = Gauge("vpay_ceiling", "A ceiling this worker runs under (runworker --print-config lists them)", ["name"])
WORKER_CONCURRENCY = Gauge("vpay_worker_concurrency", "This worker's executor threads (its ceiling on running jobs)")
LEASES_REAPED = Counter(
    "vpay_jobs_leases_reaped_total", "Expired leases freed or dead-lettered by a reaper", ["result"]
)
OLDEST_CLAIMABLE_AGE = Gauge(
    "vpay_jobs_oldest_claimable_age_seconds", "How long the longest-waiting claimable job has been due (SQL clock)"
)
QUEUE_DEPTH = Gauge("vpay_jobs_queue_depth", "Live jobs by queue, kind and state", ["queue", "kind", "state"])
JOB_DURATION = Histogram(
    "vpay_job_duration_seconds",
    "Handler run time by kind",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600),
)
BREAKER_STATE = Gauge(
    "vpay_breaker_state",
    "A vendor breaker's state: 0 closed, 1 half-open, 2 open (every rail; other vendors while not closed)",
    ["breaker"],
)
BREAKERS = Gauge("vpay_breakers", "Breakers by family (rail, webhook_host) and state", ["family", "state"])

# --- Read from the database (vpay.sql_gauges.refresh), by the worker and by the web ---------
# process's /metrics alike, so they are there with no worker running: aggregate them with
# max() across targets, never sum().
WORKERS_LIVE = Gauge(
    "vpay_workers_live", "Worker processes whose heartbeat is fresh (within vpay.sql_gauges.WORKER_LIVE_WITHIN)"
)
DEAD_LETTERS_PENDING = Gauge("vpay_dead_letters_pending", "Dead letters waiting for review, by kind", ["kind"])
DEAD_LETTERS_OLDEST_PENDING_JOB_AGE = Gauge(
    "vpay_dead_letters_pending_oldest_job_age_seconds",
    "Age of the oldest pending dead letter's job, from its first enqueue (the fence horizon counts from there)",
)
PROCESSED_JOBS_TTL = Gauge(
    "vpay_processed_jobs_ttl_seconds", "How long a fence row is kept (VPAY_PROCESSED_JOBS_TTL_SECONDS)"
)
FENCED_LIVE_JOBS = Gauge(
    "vpay_fenced_live_jobs", "Live jobs that already have a fence row (their effect committed; they still run)"
)
FENCED_LIVE_JOBS_TTL_LEFT = Gauge(
    "vpay_fenced_live_jobs_min_ttl_left_seconds",
    "Shortest time to expiry of those jobs' fence rows (the full TTL when there are none)",
)
TABLE_BYTES = Gauge("vpay_table_bytes", "On-disk size of a vpay table, with its indexes and TOAST", ["table"])
TABLE_ROWS = Gauge(
    "vpay_table_rows_estimate", "The planner's row estimate of a vpay table (pg_class.reltuples)", ["table"]
)
ALERT_LOG_LINES = Counter(
    "vpay_alert_log_lines_total", "Log records that carried alert=true, by logger and level", ["logger", "level"]
)
