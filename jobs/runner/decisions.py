"""The pure decision table: a handler's answer (or error) to exactly one settle write.

No database, no clock. The loop (``jobs.runner.worker``) executes the :class:`Settle` this
module returns, guarded on the claim's lease token.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from jobs.models import DeadLetterCause
from jobs.primitives.retry import RetryPolicy
from jobs.runner.outcome import Action, Outcome
from vpay.errors import Category, Classification, Retry


class Disposition(enum.StrEnum):
    """How one claimed job left this worker's hands."""

    FINISHED = "finished"  # row deleted
    RETRIED = "retried"  # failed, rescheduled with backoff (attempt spent)
    RESCHEDULED = "rescheduled"  # not a failure, runs again later (attempts reset)
    DEFERRED = "deferred"  # re-queued without spending an attempt
    DEAD_LETTERED = "dead_lettered"  # moved to dead_letters
    CANCELLED = "cancelled"  # an operator's cancel ended it: a dead letter, closed (jobs.primitives.cancels)
    LOST = "lost"  # our lease was taken before we could settle: answer discarded
    RELEASED = "released"  # handed back unsettled (drain ran out of grace, or never started)
    # This worker cannot run it (a newer release's task path or payload shape): back to the
    # queue, attempt refunded, for a worker that can (jobs.runner.decisions.settle_unrunnable).
    UNRUNNABLE = "unrunnable"


class AttemptsChange(enum.StrEnum):
    KEEP = "keep"  # the claim's count stands (a failure)
    RESET = "reset"  # back to 0 (the job made progress)
    REFUND = "refund"  # minus one (the attempt did not count: deferral, unstarted release)


@dataclass(frozen=True, slots=True)
class Settle:
    """Exactly one of finish / reschedule / dead-letter, with its parameters."""

    disposition: Disposition
    delay: float = 0.0
    attempts: AttemptsChange = AttemptsChange.KEEP
    add_deferral: bool = False
    cause: DeadLetterCause | None = None
    error: str = ""
    error_category: str = ""


_DEAD_LETTER_CAUSE = {
    Category.POISON: DeadLetterCause.POISON,
    Category.PERMANENT: DeadLetterCause.PERMANENT,
    Category.CONFIGURATION: DeadLetterCause.CONFIGURATION,
}


@dataclass(frozen=True, slots=True)
class JobState:
    """What the decision needs to know about the claimed row."""

    attempts: int  # including the current one (the claim counted it)
    max_attempts: int
    deferrals: int
    max_deferrals: int


def settle_outcome(outcome: Outcome, state: JobState) -> Settle:
    """Map a handler's returned :class:`Outcome`."""
    if outcome.action is Action.DONE:
        return Settle(Disposition.FINISHED)
    if outcome.action is Action.RESCHEDULE:
        return Settle(Disposition.RESCHEDULED, outcome.delay, AttemptsChange.RESET, error=outcome.reason)
    if outcome.action is Action.DEFER:
        return _defer(outcome.delay, outcome.reason, state)
    # RETRY: a failure the handler classified itself.
    if state.attempts >= state.max_attempts:
        return Settle(
            Disposition.DEAD_LETTERED,
            cause=DeadLetterCause.EXHAUSTED,
            error=outcome.reason,
            error_category=Category.TRANSIENT,
        )
    return Settle(Disposition.RETRIED, outcome.delay, error=outcome.reason, error_category=Category.TRANSIENT)


def settle_error(
    classification: Classification,
    error: str,
    state: JobState,
    policy: RetryPolicy,
    *,
    defer_seconds: float = 30.0,
    rng: random.Random | None = None,
) -> Settle:
    """Map a raised error, through its :class:`~vpay.errors.Classification`."""
    if classification.retry is Retry.DEAD_LETTER:
        cause = _DEAD_LETTER_CAUSE.get(classification.category, DeadLetterCause.PERMANENT)
        return Settle(Disposition.DEAD_LETTERED, cause=cause, error=error, error_category=classification.category)
    if classification.retry is Retry.DEFER:
        return _defer(defer_seconds, error, state)
    if state.attempts >= state.max_attempts:
        return Settle(
            Disposition.DEAD_LETTERED,
            cause=DeadLetterCause.EXHAUSTED,
            error=error,
            error_category=classification.category,
        )
    return Settle(
        Disposition.RETRIED,
        policy.backoff(state.attempts, rng),
        error=error,
        error_category=classification.category,
    )


def _defer(delay: float, reason: str, state: JobState) -> Settle:
    if state.deferrals >= state.max_deferrals:
        return Settle(
            Disposition.DEAD_LETTERED,
            cause=DeadLetterCause.DEFERRAL_CEILING,
            error=f"deferred {state.deferrals} times (ceiling {state.max_deferrals}); last: {reason}",
            error_category=Category.DEFERRED,
        )
    return Settle(
        Disposition.DEFERRED,
        delay,
        AttemptsChange.REFUND,
        add_deferral=True,
        error=reason,
        error_category=Category.DEFERRED,
    )


# How soon a job this worker could not run is offered again (to any worker).
UNRUNNABLE_RETRY_SECONDS = 10.0


def settle_unrunnable(reason: str, unrunnable_for: float | None, window: float) -> Settle:
    """A claimed job this worker cannot run (``reason``: no handler, a payload off its schema,
    a task path that does not import). During a rolling deploy that is a newer release's work,
    which an older worker must leave for a newer one: it goes back with its attempt refunded.
    Only once the workers claiming it have been unable to run it for ``window`` seconds
    (``unrunnable_for``, on the database clock, None the first time) is it poison. A window of
    0 means no other worker could ever run it (the in-process adapter): poison at once."""
    if window <= 0 or (unrunnable_for is not None and unrunnable_for >= window):
        waited = f"; no worker could run it for {window:g} s" if window > 0 else ""
        return Settle(
            Disposition.DEAD_LETTERED,
            cause=DeadLetterCause.POISON,
            error=reason + waited,
            error_category=Category.POISON.value,
        )
    return Settle(
        Disposition.UNRUNNABLE,
        delay=UNRUNNABLE_RETRY_SECONDS,
        attempts=AttemptsChange.REFUND,
        error=f"this worker cannot run it ({reason}); left for a worker that can",
    )
