"""Each webhook host's circuit breaker (``webhook_host:<host>``, ``jobs.breakers``).

A receiver host that keeps failing — no answer, a 5xx, a 429 — opens its breaker after
``VPAY_WEBHOOK_BREAKER_FAILURES`` consecutive failed attempts; while it is open the
deliveries of every endpoint on that host are deferred before an attempt is claimed, so
they spend no rung of their ladder and hold no executor. After the cool-down one
delivery is the probe. An attempt that never reached the host (the SSRF guard, no usable
secret, a changed body) says nothing about it and leaves the breaker as it was.

The deferral ceiling does not end a delivery: a deliver job with no deferrals left makes
its attempt whatever the breaker says, so the delivery ladder — and its ``exhausted``
alert — still ends a delivery to a host that never comes back (``webhooks/handlers.py``).
"""

from __future__ import annotations

import httpx
from django.conf import settings

from jobs import breakers
from webhooks.models import AttemptState

# A probe may take the attempt's whole budget and its two short transactions.
PROBE_MARGIN_SECONDS = 15.0


def limits() -> breakers.Limits:
    return breakers.Limits(
        failures=settings.VPAY_WEBHOOK_BREAKER_FAILURES,
        cool_down=settings.VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS,
        probe_lease=settings.VPAY_WEBHOOK_TIMEOUT + PROBE_MARGIN_SECONDS,
    )


def breaker_named_for(url: str) -> str | None:
    """``webhook_host:<host>`` for an endpoint URL, or None (a URL without a host)."""
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:
        return None
    return f"webhook_host:{host.lower()}" if host else None


def report(ticket: breakers.Ticket, attempt_state: AttemptState, status_code: int | None) -> None:
    """What the attempt says about the host."""
    if attempt_state == AttemptState.NO_RESPONSE or (
        status_code is not None and (status_code >= 500 or status_code == 429)
    ):
        breakers.failed(ticket, f"no answer ({attempt_state})" if status_code is None else f"HTTP {status_code}")
    elif status_code is not None or attempt_state == AttemptState.SUCCEEDED:
        breakers.succeeded(ticket)  # the host answered
    else:
        breakers.release(ticket)  # never reached the host
