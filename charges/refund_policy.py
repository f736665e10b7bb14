"""``RefundPolicy`` and the two pure tables a refund's poll decides with. No clock, no database.

A refund is driven like a charge (docs/charges.md, "Refunds"): its own ladder and horizon,
as data for the runner's poll-with-backoff primitive (``jobs.primitives.ask_again.Ladder``), and a
crash-recovery table over the same evidence a charge's uses. The table is smaller than a
charge's because only the worker ever sends a refund: no web request can be inside a rail
call for it (so there is nothing to ``Wait`` for), and there is no redirect flow (so no
dead order). What remains is the rule that keeps a refund from being sent twice: a refund
whose request went out is asked about by reference, and sent again (same reference, the
rail's idempotency key) only once the rail has said 404 for a streak spanning the window.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from charges.recovery import SubmitEvidence
from charges.settlement import Settlement, settle
from charges.states import ChargeStatus, RailStatus, RefundStatus
from jobs.primitives.ask_again import Ladder

# Refunds settle more slowly than payments (the rail moves money back through its own
# batches), so the ladder starts at 30 s and reaches its hourly rung sooner.
DEFAULT_REFUND_LADDER = (30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass(frozen=True)
class RefundPolicy:
    """The numbers behind a refund's poll.

    * ``ladder``: delays between asks, by how many status requests came before; the last repeats.
    * ``horizon``: age (from ``refunds.created_at``) past which a live refund escalates to
      ``unresolved`` on every non-terminal answer, with an alert.
    * ``past_horizon_every``: the delay between asks past the horizon (and between re-alerts).
    * ``not_found_window`` / ``not_found_streak``: how long and how many 404s before "the
      rail never received it" (the charges' numbers: they describe the rail, not the object).
    """

    ladder: tuple[float, ...] = DEFAULT_REFUND_LADDER
    horizon: float = 24 * 3600.0
    past_horizon_every: float = 3600.0
    not_found_window: float = 60.0
    not_found_streak: int = 3

    def __post_init__(self) -> None:
        if not self.ladder or any(rung <= 0 for rung in self.ladder):
            raise ValueError("the refund poll ladder needs at least one positive rung")
        if self.horizon <= 0 or self.past_horizon_every <= 0 or self.not_found_window < 0:
            raise ValueError("the horizon and the hourly period must be positive, the window non-negative")
        if self.not_found_streak < 1:
            raise ValueError("not_found_streak must be at least 1")

    def as_ladder(self) -> Ladder:
        return Ladder.of(
            self.ladder, repeat_last=True, horizon=self.horizon, past_horizon_every=self.past_horizon_every
        )

    def past(self, age: float) -> bool:
        """Whether a refund of this age (database clock) is past the horizon."""
        return self.as_ladder().past(age)

    def next_wait(self, asks_so_far: int, age: float) -> float:
        """Seconds until the next ask; past the horizon, the hourly period."""
        wait = self.as_ladder().next_wait(max(asks_so_far, 0) + 1, age=age)
        assert wait is not None  # repeat_last and a past-horizon period: the ladder never ends
        return wait


def from_settings() -> RefundPolicy:
    from django.conf import settings

    return RefundPolicy(
        ladder=tuple(settings.VPAY_REFUND_POLL_LADDER_SECONDS),
        horizon=settings.VPAY_REFUND_HORIZON_SECONDS,
        past_horizon_every=settings.VPAY_REFUND_POLL_PAST_HORIZON_SECONDS,
        not_found_window=settings.VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS,
        not_found_streak=settings.VPAY_CHARGE_NOT_FOUND_STREAK,
    )


class RefundStep(enum.StrEnum):
    SEND = "send"  # the rail never got it (no request, or a 404 streak spanning the window): POST, same reference
    ASK = "ask"  # it went out: ask the rail by reference


def recovery_step(
    submit: SubmitEvidence, not_found_count: int, not_found_age: float | None, policy: RefundPolicy
) -> RefundStep:
    """What a ``submitting`` refund's poll does.

    ============================================  ======
    evidence                                      step
    ============================================  ======
    no request row (never sent, or a crash first)  SEND
    sent; 404s: streak reached *and* window old   SEND
    sent; anything else                           ASK
    ============================================  ======

    A request that went out and was not answered may have reached the rail: sending again
    would rely on the rail's idempotency alone, so the rail is asked first, and only a
    streak of 404s spanning the window (a rail slow to index looks like one that never got
    it for a while) says it never arrived.
    """
    if submit is SubmitEvidence.NEVER:
        return RefundStep.SEND
    if (
        not_found_count >= policy.not_found_streak
        and not_found_age is not None
        and not_found_age >= policy.not_found_window
    ):
        return RefundStep.SEND
    return RefundStep.ASK


# The refund's machine is the charge's with ``pending`` for ``submitted``, so a rail's answer
# settles it by the one settlement table (charges.settlement), read through this mapping.
_AS_CHARGE = {
    RefundStatus.SUBMITTING: ChargeStatus.SUBMITTING,
    RefundStatus.PENDING: ChargeStatus.SUBMITTED,
    RefundStatus.UNRESOLVED: ChargeStatus.UNRESOLVED,
    RefundStatus.SUCCEEDED: ChargeStatus.SUCCEEDED,
    RefundStatus.FAILED: ChargeStatus.FAILED,
}


def settle_refund(status: RefundStatus, answer: RailStatus, *, past_horizon: bool) -> Settlement:
    """The settlement table for a refund (``MARK_SUBMITTED`` means ``submitting → pending``).
    ``authorized`` and ``canceled`` describe a charge's hold, never a refund: a non-answer."""
    answer = RailStatus(answer)
    if answer in (RailStatus.AUTHORIZED, RailStatus.CANCELED):
        answer = RailStatus.UNAVAILABLE
    return settle(_AS_CHARGE[RefundStatus(status)], answer, past_horizon=past_horizon)
