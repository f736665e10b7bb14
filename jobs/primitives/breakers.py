"""Circuit breakers per vendor, shared by every worker and the web process through PostgreSQL.

A breaker is named for what it protects (``rail:<code>``,
``webhook_host:<merchant>:<host>:<port>``) and is
in one of three states:

* **closed**: calls go through. Consecutive transient failures are counted (any answer
  resets the count); the ``failures``-th opens the breaker.
* **open**: calls are refused without being made: the caller defers its unit without
  spending an attempt (``BreakerOpen`` is a ``vpay.errors.DeferError``). After the
  cool-down the next caller, and only one across all processes, is let through as the
  probe (a compare-and-swap ``open → half_open`` that one writer wins).
* **half_open**: the probe is in flight; everyone else still defers. Its success closes
  the breaker, its failure re-opens it for a new cool-down. A probe that reports nothing
  within ``probe_lease`` (its worker died) is replaced by the next caller.

Results of calls admitted earlier that land in another state are evidence of the past:
they count failures but move nothing (a late success does not close an open breaker).

The decisions are pure functions (:func:`admission`, :func:`after_result`), unit-tested
cell by cell; the state lives in ``breakers`` and moves only by the compare-and-swap
writes of ``jobs.primitives.breaker_repository``. Every age is measured by the database.

Cost on the hot path: :func:`admit` is one primary-key read; the success of a call on a
breaker that has no failures writes nothing. A failure, or a success after failures, is
a read and a guarded write (re-read and retried if another worker wrote first).
"""

from __future__ import annotations

import enum
import logging
import random
import uuid
from dataclasses import dataclass

from jobs.models import BreakerState
from jobs.primitives import breaker_repository as repo
from jobs.primitives.breaker_repository import BreakerRow
from vpay.errors import DeferError

logger = logging.getLogger(__name__)

# A deferred unit comes back when the breaker could next let a probe through, never sooner
# than this, plus up to this fraction again as jitter: the hundreds of units one open
# breaker defers do not all come back in the same second.
MIN_WAIT_SECONDS = 1.0
WAIT_JITTER = 0.25
# Guarded writes lost to other writers before a result is given up on (logged): losing one
# count under a storm of concurrent failures only delays an opening by one failure.
MAX_WRITE_TRIES = 8


@dataclass(frozen=True, slots=True)
class Limits:
    """A breaker family's thresholds (named settings; see each caller)."""

    failures: int  # consecutive transient failures that open the breaker
    cool_down: float  # seconds an open breaker refuses calls before it lets a probe through
    probe_lease: float  # seconds a probe may take before another caller may probe instead

    def __post_init__(self) -> None:
        if self.failures < 1 or self.cool_down <= 0 or self.probe_lease <= 0:
            raise ValueError("a breaker needs failures >= 1 and positive cool-down and probe lease")


class Verdict(enum.Enum):
    ALLOW = "allow"  # closed: go ahead
    PROBE = "probe"  # the cool-down is over (or the probe was lost): go ahead as the probe
    DEFER = "defer"  # open, or a probe is in flight: do not call


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    wait: float = 0.0  # for DEFER: seconds until the breaker could next let a probe through


def admission(state: BreakerState, opened_age: float | None, probe_age: float | None, limits: Limits) -> Admission:
    """Whether a call may go out now, from the breaker as read (ages on the database clock)."""
    if state is BreakerState.CLOSED:
        return Admission(Verdict.ALLOW)
    if state is BreakerState.OPEN:
        left = limits.cool_down - (opened_age or 0.0)
        return Admission(Verdict.PROBE) if left <= 0 else Admission(Verdict.DEFER, left)
    left = limits.probe_lease - (probe_age or 0.0)  # half-open: a probe is out
    return Admission(Verdict.PROBE) if left <= 0 else Admission(Verdict.DEFER, left)


@dataclass(frozen=True, slots=True)
class Transition:
    state: BreakerState
    failures: int
    opened: bool = False  # a new cool-down starts now
    keep_probe: bool = False  # the probe in flight (if any) is still the breaker's


def after_result(state: BreakerState, failures: int, *, probe: bool, ok: bool, limits: Limits) -> Transition | None:
    """A call's result on the breaker as it stands now; None: nothing to write.

    ``probe``: this call is the half-open breaker's current probe. ``ok``: the vendor
    answered (anything but a transient failure)."""
    if state is BreakerState.CLOSED:
        if ok:
            return None if failures == 0 else Transition(BreakerState.CLOSED, 0)
        if failures + 1 >= limits.failures:
            return Transition(BreakerState.OPEN, failures + 1, opened=True)
        return Transition(BreakerState.CLOSED, failures + 1)
    if state is BreakerState.HALF_OPEN and probe:
        if ok:
            return Transition(BreakerState.CLOSED, 0)
        return Transition(BreakerState.OPEN, failures + 1, opened=True)
    # Open, or half-open with someone else's probe out: a call admitted before the breaker
    # opened. Its failure is counted (the row says how bad it got); its success is one late
    # answer, and the probe, not it, decides whether the vendor is back.
    if ok:
        return None
    return Transition(state, failures + 1, keep_probe=True)


class BreakerOpen(DeferError):
    """The vendor's breaker refused the call: defer the unit, spend no attempt."""

    def __init__(self, name: str, wait: float) -> None:
        delay = max(wait, MIN_WAIT_SECONDS) * (1.0 + WAIT_JITTER * random.random())
        super().__init__(f"breaker {name} is open", delay_seconds=delay)
        self.name = name


@dataclass(frozen=True, slots=True)
class Ticket:
    """A call the breaker let through; report its result with :func:`succeeded` or :func:`failed`."""

    name: str
    limits: Limits
    seen: BreakerRow  # the row as admission read it
    probe_token: uuid.UUID | None = None  # set when this call is the half-open probe

    @property
    def probe(self) -> bool:
        return self.probe_token is not None


def admit(name: str, limits: Limits) -> Ticket:
    """Let one call to ``name``'s vendor through, or raise :class:`BreakerOpen`."""
    for _ in range(MAX_WRITE_TRIES):
        row = repo.read(name)
        decided = admission(row.state, row.opened_age, row.probe_age, limits)
        if decided.verdict is Verdict.ALLOW:
            return Ticket(name, limits, row)
        if decided.verdict is Verdict.DEFER:
            raise BreakerOpen(name, decided.wait)
        # PROBE: the compare-and-swap one caller wins; the others re-read and defer.
        token = uuid.uuid4()
        if repo.write(name, row, state=BreakerState.HALF_OPEN, failures=row.failures, probe_token=token, probe=True):
            logger.info("breaker half-open: probing", extra={"breaker": name})
            return Ticket(name, limits, row, token)
    raise BreakerOpen(name, MIN_WAIT_SECONDS)  # contended on every try: some other caller is probing


def succeeded(ticket: Ticket) -> None:
    """The vendor answered (anything short of a transient failure)."""
    if not ticket.probe and ticket.seen.state is BreakerState.CLOSED and ticket.seen.failures == 0:
        return  # the hot path: nothing to reset, nothing written
    _record(ticket, ok=True, error="")


def failed(ticket: Ticket, error: str) -> None:
    """The call failed transiently (no answer, a timeout, a 5xx, a rate limit)."""
    _record(ticket, ok=False, error=error)


def release(ticket: Ticket) -> None:
    """The call was never made (refused by something after the breaker, e.g. a ceiling).
    A probe hands its turn back (``half_open → open``, the cool-down already over), so the
    next caller probes at once rather than after a probe lease."""
    if not ticket.probe:
        return
    for _ in range(MAX_WRITE_TRIES):
        row = repo.read(ticket.name)
        if row.state is not BreakerState.HALF_OPEN or row.probe_token != ticket.probe_token:
            return
        if repo.write(ticket.name, row, state=BreakerState.OPEN, failures=row.failures):
            return


def _record(ticket: Ticket, *, ok: bool, error: str) -> None:
    for _ in range(MAX_WRITE_TRIES):
        row = repo.read(ticket.name)
        probe = ticket.probe and row.state is BreakerState.HALF_OPEN and row.probe_token == ticket.probe_token
        move = after_result(row.state, row.failures, probe=probe, ok=ok, limits=ticket.limits)
        if move is None:
            return
        if repo.write(
            ticket.name,
            row,
            state=move.state,
            failures=move.failures,
            opened=move.opened,
            probe_token=row.probe_token if move.keep_probe else None,
            error=error,
        ):
            if move.state is not row.state:
                log = logger.warning if move.state is BreakerState.OPEN else logger.info
                log(
                    f"breaker {move.state}",
                    extra={"breaker": ticket.name, "from": str(row.state), "failures": move.failures},
                )
            return
    logger.warning("a breaker result was not recorded: every write lost a race", extra={"breaker": ticket.name})
