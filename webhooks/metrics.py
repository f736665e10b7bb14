"""Prometheus metrics of webhook delivery (served by the worker's ``--metrics-port``).

Labelled by outcome only: an endpoint id per label would be a cardinality bomb, and the
per-endpoint story lives in the delivery and attempt rows.
"""

from prometheus_client import Counter, Gauge, Histogram

ATTEMPTS = Counter(
    "vpay_webhook_attempts_total",
    "Webhook attempts by outcome (succeeded, failed, no_response, stale)",
    ["outcome"],
)
DELIVERIES_FINISHED = Counter(
    "vpay_webhook_deliveries_finished_total",
    "Deliveries that reached a terminal state (succeeded, exhausted, refused, cancelled)",
    ["state"],
)
EVENTS_FANNED_OUT = Counter("vpay_webhook_events_fanned_out_total", "Events fanned out into deliveries")
EVENTS_ABANDONED = Counter("vpay_webhook_events_abandoned_total", "Events abandoned after failing every fan-out pass")
ATTEMPTS_ABANDONED = Counter(
    "vpay_webhook_attempts_abandoned_total", "Attempts whose lease expired with no answer recorded (recovered)"
)
AT_CAP = Counter("vpay_webhook_at_cap_total", "Deliver jobs that found their endpoint at its in-flight cap")
ATTEMPT_DURATION = Histogram(
    "vpay_webhook_attempt_duration_seconds",
    "Time from the request's start to the answer's (bounded) end",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30),
)

# --- Read from the database (vpay.sql_gauges.refresh) ------------------------------------------
EVENTS_PENDING_FAN_OUT = Gauge("vpay_webhook_events_pending_fan_out", "Events waiting to be fanned out")
EVENTS_PENDING_FAN_OUT_AGE = Gauge(
    "vpay_webhook_events_pending_fan_out_oldest_age_seconds", "Age of the oldest event waiting to be fanned out"
)
EVENTS_ABANDONED_PENDING = Gauge(
    "vpay_webhook_events_abandoned_pending", "Events whose fan-out was abandoned and not yet re-driven by an operator"
)
DELIVERIES_PENDING = Gauge("vpay_webhook_deliveries_pending", "Deliveries waiting for their next attempt")
DELIVERIES_FAILED_RECENTLY = Gauge(
    "vpay_webhook_deliveries_failed_24h",
    "Deliveries that ended exhausted or refused in the last 24 hours and were not resent since, by state",
    ["state"],
)
