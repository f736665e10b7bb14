"""Endpoint health as a pure decision: is an endpoint failing long enough to warn, or to disable?

What "only failed for N days" means, precisely:

* A **receiver failure** is an attempt the receiver answered with a non-2xx (``failed``
  with a status code) or did not answer (``no_response``: timeout, reset, refused, its
  name did not resolve). Attempts that never left because of vpay (no usable secret, a
  changed body, the SSRF guard: ``failed`` without a status code), and attempts lost to a
  dead worker (``abandoned``, ``stale``), are not evidence about the receiver.
* The **streak** is the receiver failures since the endpoint's latest successful attempt,
  not before its ``health_since`` (creation, or the last re-enable) and within the
  lookback (twice the window).
* The streak's **span** is the time between its first and its latest failure: evidence at
  both ends that the endpoint was failing, and nothing succeeded in between or since. One
  event's ladder (about 28 h) cannot span 5 days alone; an endpoint nobody sent anything
  to for days is not called failing for those days.
* **Warn** once per streak when the span reaches half the window. **Disable** when the span
  reaches the window *and* the streak's warning is at least half a window old, so the
  merchant always had half a window's notice (with sparse traffic the disable can come
  later than the window, never sooner than the warning allows).

Every input is an age or a span computed by PostgreSQL (``webhooks.health_sql``); this
module only compares numbers, and ``window_seconds <= 0`` switches the check off.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    OK = "ok"
    """Nothing to do: healthy, failing for less than half the window, or already warned
    and not yet disableable."""
    WARN = "warn"
    """Tell the merchant (its other endpoints) and the operators: disabled at the window."""
    DISABLE = "disable"
    """Failing for the whole window, warned long enough ago: disable it."""


@dataclass(frozen=True)
class Evidence:
    span_seconds: float | None
    """Latest minus first receiver failure of the current streak; None: no streak."""
    warned_seconds_ago: float | None
    """How long ago this streak was warned about; None: not yet (a warning of an earlier
    streak, before a success or a re-enable, does not count)."""


def decide(evidence: Evidence, window_seconds: float) -> Verdict:
    """The verdict for one endpoint (see the module docstring)."""
    if window_seconds <= 0 or evidence.span_seconds is None:
        return Verdict.OK
    half = window_seconds / 2
    if evidence.warned_seconds_ago is None:
        return Verdict.WARN if evidence.span_seconds >= half else Verdict.OK
    if evidence.span_seconds >= window_seconds and evidence.warned_seconds_ago >= half:
        return Verdict.DISABLE
    return Verdict.OK
