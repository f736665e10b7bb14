"""Named points on the money path, where the test suite can stop a worker dead.

Shipping code calls :func:`reached` at each point in :data:`POINTS`, one line each. Without
a callback it does nothing but read one module global: no environment variable is read
here, nothing is imported, nothing is logged. Only the test suite installs a callback
(``tests/fault_injection.py``, loaded into a worker subprocess by the test's own
``sitecustomize``; it refuses to load in live mode), which SIGKILLs the process at the
point it was told: the rehearsals of docs/rehearsals.md.

A point is named for what has just become durable (or been heard) and what has not yet:
the kill then leaves exactly the state a crash at that instant leaves.
"""

from __future__ import annotations

from collections.abc import Callable

POINTS: dict[str, str] = {
    "job.claimed": "a job was claimed (the lease committed) and its handler has not started",
    "job.ran": "a handler returned (its own transactions committed) and its job is not settled yet",
    "rail.request_recorded": "a rail request row is committed and the request not yet sent",
    "rail.answered": "the rail answered and nothing of the answer is recorded or settled yet",
    "webhook.attempt_recorded": "a delivery attempt row is committed (in_flight) and nothing is sent yet",
    "webhook.carried": "a deliver job's batch beside its own is begun (attempt rows committed, jobs held) and none of it is sent",
    "webhook.answered": "the receiver answered and the attempt's outcome is not recorded yet",
    "fan_out.event_committed": "a fan-out transaction (a page of events, or one) committed, the next not yet begun",
    "fan_out.deliveries_written": "a fan-out transaction's deliveries and jobs are written, not yet committed",
}

_callback: Callable[[str, str], None] | None = None


def reached(name: str, subject: str = "") -> None:
    """The process is at point ``name`` (``subject``: which kind, operation, …). A no-op
    unless a test installed a callback."""
    callback = _callback
    if callback is not None:
        callback(name, subject)


def install(callback: Callable[[str, str], None] | None) -> None:
    """Install (or, with None, remove) the one callback. For the test suite only."""
    global _callback
    _callback = callback
