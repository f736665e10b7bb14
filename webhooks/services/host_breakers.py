"""Each merchant's circuit breaker per receiver host and port
(``webhook_host:<merchant>:<host>:<port>``, ``jobs.primitives.breakers``).

A receiver host that keeps failing — no answer, a 5xx, a 429 — opens its breaker after
``VPAY_WEBHOOK_BREAKER_FAILURES`` consecutive failed attempts; while it is open the
deliveries of every endpoint of that merchant on that host and port are deferred before an
attempt is claimed, so they spend no rung of their ladder and hold no executor. After the
cool-down one delivery is the probe. An attempt that never reached the host (the SSRF guard,
no usable secret, a changed body) says nothing about it and leaves the breaker as it was.

Why per merchant. Receiver hosts are shared (an integration platform's inbox, a hosting
provider's name): keyed on the host alone, one merchant whose endpoint there fails — or who
points an endpoint at it and makes it fail on purpose — would defer every other merchant's
deliveries to it. Keeping a merchant's failures to that merchant's endpoints makes that
impossible by construction. The alternative, one breaker per host that opens only on
failures from more than one merchant, was not taken: the row would have to remember which
merchants failed (one merchant with two accounts still passes), and it would still let two
colluding merchants stop a third. The cost of the choice: a host that is down for everyone
is found down once per merchant (``VPAY_WEBHOOK_BREAKER_FAILURES`` attempts each), and
there is a breaker row per merchant and host that ever failed (``vpay_breakers`` counts
them by state, whatever their number). The port is part of the key: two services on one
host fail apart.

The deferral ceiling does not end a delivery: a deliver job with no deferrals left makes
its attempt whatever the breaker says, so the delivery ladder — and its ``exhausted``
alert — still ends a delivery to a host that never comes back (``webhooks/handlers.py``).
"""

from __future__ import annotations

import httpx
from django.conf import settings

from jobs.primitives import breakers
from webhooks.models import AttemptState

# A probe may take the attempt's whole budget and its two short transactions.
PROBE_MARGIN_SECONDS = 15.0


def limits() -> breakers.Limits:
    return breakers.Limits(
        failures=settings.VPAY_WEBHOOK_BREAKER_FAILURES,
        cool_down=settings.VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS,
        probe_lease=settings.VPAY_WEBHOOK_TIMEOUT + PROBE_MARGIN_SECONDS,
    )


def breaker_named_for(merchant_id: str, url: str) -> str | None:
    """``webhook_host:<merchant>:<host>:<port>`` for an endpoint URL of ``merchant_id``
    (the port the attempt connects to: the scheme's when the URL names none; an IPv6 host
    in brackets), or None for a URL without a host."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return None
    host = parsed.host.lower()
    if not host:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"webhook_host:{merchant_id}:{f'[{host}]' if ':' in host else host}:{port}"


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
