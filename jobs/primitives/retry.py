"""Retry policy: how many attempts, and how long between them.

The default is the queue's policy: 5 attempts, exponential backoff with full jitter,
base 30 s, cap 1 h. A kind may override it, and says why next to its registration.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and full-jitter exponential backoff (AWS "full jitter")."""

    max_attempts: int = 5
    base_seconds: float = 30.0
    cap_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_seconds < 0 or self.cap_seconds < self.base_seconds:
            raise ValueError("need 0 <= base_seconds <= cap_seconds")

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the delay after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        # min() before the power would overflow for large attempt numbers.
        if exponent >= 64:
            return self.cap_seconds
        return min(self.cap_seconds, self.base_seconds * (2**exponent))

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Delay before the next try after failed attempt ``attempt``: uniform in [0, ceiling]."""
        return (rng or random).uniform(0.0, self.ceiling(attempt))

    def longest_window(self) -> float:
        """The longest time from a first attempt to the last retry, waits only."""
        return sum(self.ceiling(n) for n in range(1, self.max_attempts))


DEFAULT_RETRY = RetryPolicy()
