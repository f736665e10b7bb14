"""``recovery_step``: what to do with a charge found in ``submitting``. Pure; no clock.

``submitting`` covers two physically different situations — "we crashed before the POST"
and "the POST went out and the answer was lost" — and it is also the ordinary state of a
confirm that is still inside its rail call. ``provider_requests`` is the evidence that
tells the first two apart; the charge's age (``now() - created_at``, measured by
PostgreSQL on the statement that read the row) is what tells them from the third.

The function takes durations, never instants, so no caller can hand it a reading of the
wrong clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from charges.policy import RecoveryPolicy
from charges.states import RailFlow


class SubmitEvidence(enum.StrEnum):
    """What ``provider_requests`` says about the charge's submit."""

    NEVER = "never"  # no submit row: we died before the POST was sent
    UNANSWERED = "unanswered"  # sent, and no usable answer (none at all, 5xx, 409, 429, an unreadable 2xx)
    ANSWERED = "answered"  # the rail answered the submit (we died before recording it)


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything the table reads about one ``submitting`` charge."""

    age: float  # seconds since charges.created_at, on the database clock
    flow: RailFlow
    submit: SubmitEvidence
    not_found_count: int = 0  # status requests answered 404 since the first one
    not_found_age: float | None = None  # seconds since the first of them (database clock)


class Step(enum.StrEnum):
    WAIT = "wait"  # too young for any evidence to mean anything: ask nothing, write nothing
    FAIL_DEAD_ORDER = "fail_dead_order"  # redirect order nobody was handed a URL for
    RESUBMIT = "resubmit"  # the rail never got it: send it again, same reference
    POLL = "poll"  # the rail may have it: ask


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    step: Step
    wait_seconds: float = 0.0  # only for WAIT: the rest of the window, in [0, window]


def recovery_step(evidence: Evidence, policy: RecoveryPolicy) -> RecoveryAction:
    """The crash-recovery table for a ``submitting`` charge.

    1. Younger than ``not_found_window``: ``WAIT`` for exactly the rest of the window,
       whatever the evidence. A confirm may still be inside its rail call (its rail
       timeout is a third of the window), and every other answer would move the charge out
       from under it: its compare-and-swap would then match nothing. This is the first
       question, asked once here rather than at each call site, so no caller can lose it.
       The wait is clamped into ``[0, window]``: a row whose ``created_at`` leads the
       database's ``now()`` (clock steps) waits one window, not one skew.
    2. Redirect flow: ``FAIL_DEAD_ORDER``. The URL is handed out only by the compare-and-
       swap that leaves ``submitting``, so nobody could have paid this, and the
       ``pay_token`` needed to ask the rail about it was in the answer we lost: nobody can
       ever ask either. Polling it would fail on every rung forever.
    3. Push flow, never sent: ``RESUBMIT`` (same reference; the rail's idempotency key).
    4. Push flow, 404s: ``RESUBMIT`` only once the streak is long enough *and* the first
       404 is at least a window old — three polls can happen in a second on the first
       rungs, and a rail slow to index a new charge looks identical to one that never got
       it. Both are required, never either.
    5. Otherwise ``POLL``: the rail may well have it.
    """
    window = policy.not_found_window
    if evidence.age < window:
        return RecoveryAction(Step.WAIT, min(max(window - evidence.age, 0.0), window))
    if evidence.flow == RailFlow.REDIRECT:
        return RecoveryAction(Step.FAIL_DEAD_ORDER)
    if evidence.submit is SubmitEvidence.NEVER:
        return RecoveryAction(Step.RESUBMIT)
    if (
        evidence.not_found_count >= policy.not_found_streak
        and evidence.not_found_age is not None
        and evidence.not_found_age >= window
    ):
        return RecoveryAction(Step.RESUBMIT)
    return RecoveryAction(Step.POLL)
