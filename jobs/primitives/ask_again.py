"""Poll-with-backoff: the runner's one primitive for "ask again later". Pure; no clock.

A kind that waits on something slow (a rail settling a charge, a merchant's endpoint coming
back) describes its wait as data, a :class:`Ladder`, and asks it what to do after each ask:
wait this long and ask again, or stop (the ladder ran out: the caller's terminal
transition). A horizon, measured by the caller on the database clock from when the wait
began, switches the ladder to its past-the-horizon period, or ends it. The kinds keep
their own ladders (a charge's poll rises from seconds to an hour and never stops before a
human is told; a webhook's retry runs out after about a day), not their own machinery.

Cancel is respected by the runner, not here: the reschedule that carries a kind's next ask
refuses a job with a cancel request, and the job ends cancelled (``jobs.primitives.cancels``); a kind
that must not be cancelled (the charge poll) says so in its registration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ladder:
    """The waits between asks, as data.

    ``rungs[i]`` is the wait after ``i + 1`` asks. When the rungs run out, ``repeat_last``
    keeps asking at the last rung; otherwise the ladder ends. Past ``horizon`` seconds (of
    the wait's age), the wait is ``past_horizon_every`` if given, else the ladder ends.
    """

    rungs: tuple[float, ...]
    repeat_last: bool = False
    horizon: float | None = None
    past_horizon_every: float | None = None

    def __post_init__(self) -> None:
        if not self.rungs or any(r < 0 for r in self.rungs):
            raise ValueError("a ladder needs at least one rung, none negative")
        if self.horizon is not None and self.horizon < 0:
            raise ValueError("a horizon cannot be negative")
        if self.past_horizon_every is not None and self.past_horizon_every <= 0:
            raise ValueError("the past-the-horizon period must be positive")

    @classmethod
    def of(cls, rungs: Sequence[float], **options) -> Ladder:
        return cls(tuple(float(r) for r in rungs), **options)

    def past(self, age: float | None) -> bool:
        """Whether a wait of this age (seconds, on the database clock) is past the horizon."""
        return self.horizon is not None and age is not None and age >= self.horizon

    def next_wait(self, asks: int, *, age: float | None = None) -> float | None:
        """Seconds to wait after ``asks`` asks (0 before the first: the first rung), or
        ``None`` when the ladder has ended: the caller's terminal transition."""
        if asks < 0:
            raise ValueError("asks cannot be negative")
        if self.past(age):
            return self.past_horizon_every
        index = max(asks - 1, 0)
        if index >= len(self.rungs):
            return float(self.rungs[-1]) if self.repeat_last else None
        return float(self.rungs[index])
