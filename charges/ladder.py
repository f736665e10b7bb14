"""The poll ladder and the 24-hour horizon: pure functions of durations, no clock.

Both take durations measured by PostgreSQL (``now() - created_at`` on the statement that
read the charge); neither ever reads this host's clock.
"""

from __future__ import annotations

from charges.policy import RecoveryPolicy
from jobs.primitives.ask_again import Ladder


def ladder(policy: RecoveryPolicy) -> Ladder:
    """The charge poll's ladder, as the runner's poll-with-backoff primitive takes it: rising
    rungs whose last repeats, and past the horizon an hourly ask that never stops (a late
    success is the normal way an unresolved charge ends)."""
    return Ladder.of(
        policy.ladder, repeat_last=True, horizon=policy.horizon, past_horizon_every=policy.past_horizon_every
    )


def poll_delay(polls_so_far: int, policy: RecoveryPolicy, *, past_horizon: bool = False) -> float:
    """Seconds until the next poll after ``polls_so_far`` polls (0 before the first answer).

    Past the horizon the charge is still polled — a late success is the normal way an
    unresolved charge ends — but hourly, not on the ladder.
    """
    if past_horizon:
        return policy.past_horizon_every
    wait = ladder(policy).next_wait(max(polls_so_far, 0) + 1)
    assert wait is not None  # the poll ladder repeats its last rung: it never ends
    return wait


def past_the_horizon(age_seconds: float, policy: RecoveryPolicy) -> bool:
    """Whether a charge of this age (from ``charges.created_at``, on the database clock)
    is past the horizon. ``created_at`` is written before the rail is ever called, so this
    is the age of the payer's exposure, not of our bookkeeping."""
    return ladder(policy).past(age_seconds)
