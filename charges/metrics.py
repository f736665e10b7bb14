"""Prometheus counters of the charge worker and the confirm (served with the process's others)."""

from prometheus_client import Counter, Gauge

CHARGES_SETTLED = Counter(
    "vpay_charges_settled_total", "Charges that reached a terminal state, by rail and outcome", ["rail", "outcome"]
)
CHARGES_UNRESOLVED = Counter(
    "vpay_charges_unresolved_total",
    "Charges escalated to unresolved past the horizon (transitions, not re-alerts)",
    ["rail"],
)
RAIL_REQUESTS = Counter(
    "vpay_rail_requests_total",
    "Rail requests by rail, operation and result (an HTTP status, or 'no_answer')",
    ["rail", "operation", "result"],
)

# Read from the database (vpay.sql_gauges.refresh): every charge not yet terminal.
CHARGES_LIVE = Gauge("vpay_charges_live", "Charges not yet terminal, by rail and state", ["rail", "state"])
REFUNDS_SETTLED = Counter(
    "vpay_refunds_settled_total", "Refunds that reached a terminal state, by rail and outcome", ["rail", "outcome"]
)
REFUNDS_UNRESOLVED = Counter(
    "vpay_refunds_unresolved_total",
    "Refunds escalated to unresolved past the horizon (transitions, not re-alerts)",
    ["rail"],
)
