"""A freed rail slot goes to the longest-waiting poll of this process.

A poll that a rail's ceiling (or this worker's share of it) held back is deferred: its job
comes back after the earliest request in flight could have ended, at least a second and at
most five, plus jitter (``rail_gate.at_ceiling``). Slots usually free in milliseconds, so
without more a busy rail left its waiters idle for seconds after the slot they wanted was
free: the p99 of a payment's create → webhook. So each poll deferred for a slot is
remembered here, by its job's name, and each request this process finishes (its answer or
failure recorded, so the slot is free in ``provider_requests`` too) pulls the longest-waiting
one forward (``jobs.port.pull_forward_waiting``), as a finished webhook attempt hands its
endpoint's slot on (``webhooks.services.delivery.hand_off``).

Per process, and best effort: a waiter is woken by its own process's requests (a process
that holds no slot of the rail wakes nobody, and its waiters keep their timers); a name
whose job has moved on (run by another process, or not yet settled as deferred when the slot
freed, or run by its own timer since and now waiting for its next rung) is passed over: the
job row says whether it is still deferred. Nothing is asked of the database while nobody
waits.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from django.conf import settings

from jobs.port import pull_forward_waiting

logger = logging.getLogger(__name__)

# Names remembered per rail (the oldest forgotten first: their timers still run them), and
# how many are offered for one freed slot (the first may already have moved on).
REMEMBERED = 1000
CANDIDATES = 3


class RailWaiters:
    """Polls of this process waiting for a slot, per rail, longest-waiting first."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._waiting: dict[str, OrderedDict[str, None]] = {}

    def add(self, rail_code: str, job_name: str) -> None:
        with self._lock:
            names = self._waiting.setdefault(rail_code, OrderedDict())
            names.pop(job_name, None)
            names[job_name] = None
            while len(names) > self.limit:
                names.popitem(last=False)

    def take(self, rail_code: str, n: int) -> list[str]:
        with self._lock:
            names = self._waiting.get(rail_code)
            taken = [names.popitem(last=False)[0] for _ in range(min(n, len(names)))] if names else []
            if names is not None and not names:
                del self._waiting[rail_code]
            return taken

    def put_back(self, rail_code: str, job_names: list[str]) -> None:
        """Names taken but not woken, back at the front in their order."""
        with self._lock:
            names = self._waiting.setdefault(rail_code, OrderedDict())
            for name in reversed(job_names):
                if name not in names:
                    names[name] = None
                    names.move_to_end(name, last=False)

    def discard(self, rail_code: str, job_name: str) -> None:
        with self._lock:
            names = self._waiting.get(rail_code)
            if names is not None:
                names.pop(job_name, None)
                if not names:
                    del self._waiting[rail_code]

    def count(self, rail_code: str) -> int:
        with self._lock:
            return len(self._waiting.get(rail_code, ()))

    def waiting(self, rail_code: str) -> list[str]:
        with self._lock:
            return list(self._waiting.get(rail_code, ()))


WAITERS = RailWaiters()


def wait_for_slot(rail_code: str, job_name: str) -> None:
    """The poll named ``job_name`` is deferred for a slot of ``rail_code``: wake it when one frees."""
    WAITERS.add(rail_code, job_name)


def running(rail_code: str, job_name: str) -> None:
    """The poll named ``job_name`` runs (on its timer, or woken): it waits for no slot now. Its
    name left behind would count as a waiter in :func:`few_waiting` until a freed slot passed
    it over, and a busy process's stale names turned the short wait off (bench/CHARGES.md)."""
    WAITERS.discard(rail_code, job_name)


def few_waiting(rail_code: str) -> bool:
    """Fewer of this process's polls wait for a slot of ``rail_code`` than its ceiling holds."""
    return WAITERS.count(rail_code) < settings.VPAY_RAIL_MAX_IN_FLIGHT


def slot_freed(rail_code: str) -> str | None:
    """A request of this process to ``rail_code`` ended: pull the longest-waiting poll forward.
    Returns the name woken, if any. Never raises (the waiters' timers are the backstop)."""
    names = WAITERS.take(rail_code, CANDIDATES)
    if not names:
        return None
    try:
        # Only a job still deferred (the database says so: its last run deferred). One whose
        # timer ran it since, and which now waits for its next rung, is left to its time.
        moved = pull_forward_waiting(names, 1, deferred_only=True)
    except Exception:  # best effort: it must never cost the rail call it follows
        logger.warning("could not hand a freed rail slot on; the waiters' timers will", exc_info=True)
        WAITERS.put_back(rail_code, names)
        return None
    if not moved:
        return None  # every name offered had moved on
    WAITERS.put_back(rail_code, names[names.index(moved[0]) + 1 :])
    return moved[0]
