"""Prometheus metrics of the worker and the queue (the web process adds django-prometheus').

Counters are labelled by what an alert rule needs: kind and disposition for jobs, category
and severity for errors. Gauges that describe the queue are computed in SQL.
"""

from prometheus_client import Counter, Gauge, Histogram

JOBS = Counter("vpay_jobs_total", "Claimed jobs by kind and disposition", ["kind", "disposition"])
ERROR_EVENTS = Counter("vpay_error_events_total", "Job failures by category and severity", ["category", "severity"])
ALERT_EVENTS = Counter("vpay_alert_events_total", "Log lines that carried alert=true", ["category", "severity"])
DUPLICATES_SKIPPED = Counter("vpay_jobs_duplicates_skipped_total", "Duplicate job_ids skipped by the fence", ["kind"])
CLAIM_FAILURES = Counter("vpay_jobs_claim_failures_total", "Claims that failed (database unreachable or erroring)")
SETTLE_FAILURES = Counter(
    "vpay_jobs_settle_failures_total", "Settle writes that failed; the lease is handed back when the database answers"
)
RUNNING_JOBS = Gauge("vpay_worker_running_jobs", "Jobs this worker's executors are running now")
# Every numeric ceiling the worker runs under (jobs.ceilings), by name.
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
