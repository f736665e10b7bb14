"""Whether a rail request may go out now: the rail's breaker, and the worker's share of it.

Three guards, each for its own harm, checked before a request row is written:

1. **The breaker** (``rail:<code>``, ``jobs.primitives.breakers``): a rail failing transiently again
   and again is not asked at all for a cool-down, then probed once. Shared by every
   process through PostgreSQL.
2. **The worker's share**: one rail may hold at most half of a worker's executors
   (:func:`worker_share`), counted in this process, so a rail that never answers leaves
   every worker the other half for webhooks, alerts and sweeps whatever the ceiling says.
3. **The ceiling** (``VPAY_RAIL_MAX_IN_FLIGHT``): requests in flight to one rail across all
   workers, counted in ``provider_requests`` under a per-rail lock in the transaction that
   writes the new request row (``charges.request_log.record_sent_within_ceiling``).

A request any guard refuses is never sent and leaves no row: :class:`RailDeferred`, a
``DeferError``, which each caller turns into its own disposition (charges/services/polling.py,
confirm.py). A probe refused by a later guard hands its turn back.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter

from django.conf import settings
from django.db import DatabaseError

from jobs.primitives import breakers
from vpay.errors import DeferError

logger = logging.getLogger(__name__)

# A probe may take the whole exchange (the adapter's hard deadline) and the writes around it.
PROBE_MARGIN_SECONDS = 5.0
# A poll over the ceiling or its worker's share comes back after the earliest request in
# flight could have ended, but no later than this (a slot usually frees in well under a
# second on a healthy rail), nor sooner than MIN_WAIT, plus up to JITTER of it again.
CEILING_MAX_WAIT_SECONDS = 5.0
MIN_WAIT_SECONDS = 1.0
JITTER = 0.25
# Unless the slots are held by requests younger than MOVING_AGE (the rail is answering, so
# one frees within moments) or by this worker's own (the share), and fewer of this process's
# polls than the ceiling already wait (more would come back in waves to fight over it): then
# it comes back after SOON_WAIT, doubled at each deferral since its last progress, spread
# over half to one and a half times that, and never later than the wait above. A freed slot
# wakes only its own process's waiters (charges.services.rail_slots), so without this a poll
# deferred behind the web's submits, which wake nobody, sat out the whole five seconds with
# the rail idle (bench/CHARGES.md: the create → webhook p99). Due is not run: an idle worker
# claims it at its next NOTIFY or idle poll (a second).
MOVING_AGE_SECONDS = 1.0
SOON_WAIT_SECONDS = 0.1


class RailDeferred(DeferError):
    """Nothing was sent: the rail's breaker is open, or the rail has its ceiling (or this
    worker its share) of requests in flight. Not a ``RailError``: the rail said nothing.
    ``for_slot``: held back for a slot (ceiling or share), not by the breaker: a freed slot
    may wake the caller sooner (``charges.services.rail_slots``). ``soon``: that slot is
    held by requests that should end within moments (:func:`slot_wait`)."""

    def __init__(
        self, message: str = "deferred", *, delay_seconds: float = 30.0, for_slot: bool = False, soon: bool = False
    ) -> None:
        super().__init__(message, delay_seconds=delay_seconds)
        self.for_slot = for_slot
        self.soon = soon

    def delay_after(self, deferrals: int) -> float:
        """The wait for a caller deferred ``deferrals`` times since its last progress (the job's
        count: the breaker's deferrals and the long waits count too, which only lengthens it)."""
        if not self.soon:
            return self.delay_seconds
        return min(slot_wait(deferrals) * (0.5 + random.random()), self.delay_seconds)


def slot_wait(deferrals: int) -> float:
    """A slot held by moving requests: SOON_WAIT, doubled at each deferral, so a rail whose
    slots stay full is asked less and less often (its long wait caps it)."""
    return SOON_WAIT_SECONDS * 2.0 ** min(deferrals, 16)


def breaker_name(rail_code: str) -> str:
    return f"rail:{rail_code}"


def limits() -> breakers.Limits:
    """The rails' breaker thresholds (settings), read at each use."""
    return breakers.Limits(
        failures=settings.VPAY_RAIL_BREAKER_FAILURES,
        cool_down=settings.VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS,
        probe_lease=settings.VPAY_RAIL_TIMEOUT_SECONDS + PROBE_MARGIN_SECONDS,
    )


def admit(rail_code: str) -> breakers.Ticket:
    """The breaker's ticket for one request to ``rail_code``, or :class:`RailDeferred`."""
    try:
        return breakers.admit(breaker_name(rail_code), limits())
    except breakers.BreakerOpen as exc:
        raise RailDeferred(str(exc), delay_seconds=exc.delay_seconds) from None


def at_ceiling(
    rail_code: str, ticket: breakers.Ticket, earliest_left: float | None, why: str, *, soon: bool = False
) -> RailDeferred:
    """Refused after the breaker admitted it: the probe (if it was one) hands its turn back.
    ``soon``: the slots are held by requests that should end within moments."""
    _quietly(breakers.release, ticket)
    wait = min(max(earliest_left or 0.0, MIN_WAIT_SECONDS), CEILING_MAX_WAIT_SECONDS)
    return RailDeferred(
        f"rail {rail_code} {why}", delay_seconds=wait * (1.0 + JITTER * random.random()), for_slot=True, soon=soon
    )


def abandoned(ticket: breakers.Ticket) -> None:
    """The call ended without a result about the rail (a bug, an interrupt)."""
    _quietly(breakers.release, ticket)


def answered(ticket: breakers.Ticket) -> None:
    """The rail answered (any answer, a refusal included: the rail is up)."""
    _quietly(breakers.succeeded, ticket)


def failed(ticket: breakers.Ticket, error: str) -> None:
    """No usable answer (``RailUnavailable``)."""
    _quietly(breakers.failed, ticket, error)


def _quietly(fn, *args) -> None:
    # The breaker is bookkeeping around a call whose answer is already in hand (recorded in
    # provider_requests, or about to be with its settlement): a database error here must not
    # cost the caller that answer.
    try:
        fn(*args)
    except DatabaseError:
        logger.warning("could not update a rail breaker", exc_info=True)


def worker_share(concurrency: int | None) -> int | None:
    """How many of one worker's executors a single rail may hold: half (at least one).
    None outside a worker (the web process: its threads are not the queue's)."""
    return None if concurrency is None else max(1, concurrency // 2)


class RailShares:
    """This process's requests in flight, per rail (the per-worker share)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    def acquire(self, rail_code: str, share: int | None) -> bool:
        with self._lock:
            if share is not None and self._held[rail_code] >= share:
                return False
            self._held[rail_code] += 1
            return True

    def release(self, rail_code: str) -> None:
        with self._lock:
            self._held[rail_code] -= 1
            if self._held[rail_code] <= 0:
                del self._held[rail_code]

    def held(self, rail_code: str) -> int:
        with self._lock:
            return self._held[rail_code]


SHARES = RailShares()
