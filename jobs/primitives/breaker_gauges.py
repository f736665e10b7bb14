"""Breaker state as Prometheus gauges, read from ``breakers`` (SQL) at refresh time.

Refreshed by the web process's ``/metrics`` before each scrape (vpay/metrics_access.py) and
by the worker with its other SQL gauges. Every rail's breaker gets a gauge even while
closed (rails are few, and "closed" is worth seeing); a webhook host's only while it is not
closed, since one label per merchant host would grow without bound. ``vpay_breakers``
counts them all by family and state.
"""

from __future__ import annotations

from jobs.models import BreakerState
from jobs.primitives import breaker_repository
from vpay import metrics

STATE_VALUE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}
ALWAYS_SHOWN = ["rail:"]


def refresh() -> None:
    rows = breaker_repository.for_gauges(ALWAYS_SHOWN)
    counts = breaker_repository.count_by_state()
    metrics.BREAKER_STATE.clear()
    for name, state, _failures in rows:
        metrics.BREAKER_STATE.labels(breaker=name).set(STATE_VALUE[BreakerState(state)])
    metrics.BREAKERS.clear()
    for family, state, count in counts:
        metrics.BREAKERS.labels(family=family, state=state).set(count)
