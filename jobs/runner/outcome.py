"""What a handler answers. The loop, not the handler, turns it into a write on ``jobs``."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.StrEnum):
    DONE = "done"  # finished: delete the row
    RETRY = "retry"  # failed, try again after `delay` (spends the attempt)
    RESCHEDULE = "reschedule"  # not a failure: run again after `delay`, attempts reset
    DEFER = "defer"  # could not run now (breaker, rate limit): no attempt spent


@dataclass(frozen=True, slots=True)
class Outcome:
    """A handler's answer. Delays are relative; the database clock turns them into run_at."""

    action: Action
    delay: float = 0.0
    reason: str = ""

    @classmethod
    def done(cls) -> Outcome:
        return cls(Action.DONE)

    @classmethod
    def retry_after(cls, seconds: float, reason: str) -> Outcome:
        """A failure the handler classified itself; counts as an attempt."""
        return cls(Action.RETRY, max(float(seconds), 0.0), reason)

    @classmethod
    def reschedule_in(cls, seconds: float, reason: str = "") -> Outcome:
        """Run again later; not a failure (polling ladders, singletons)."""
        return cls(Action.RESCHEDULE, max(float(seconds), 0.0), reason)

    @classmethod
    def defer(cls, seconds: float, reason: str) -> Outcome:
        """Cannot proceed now for a reason outside this job; spends no attempt."""
        return cls(Action.DEFER, max(float(seconds), 0.0), reason)
