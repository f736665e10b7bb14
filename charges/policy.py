"""``RecoveryPolicy``: every window, count and ladder the charge worker decides with.

One plain value, read from settings. It is deliberately not a test seam: the tests that
shrink the not-found window to 50 ms set the same settings a deployment sets, and the
worker runs exactly the code it runs at 60 s. There is no test-only branch anywhere that
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

# 10 s, 20 s, … rising. Indexed by how many times the rail has been asked about the
# charge (the count of its status requests), not by ``jobs.attempts``: a rescheduled job's
# attempts are reset to zero, so they cannot say how far up the ladder a charge is.
DEFAULT_LADDER = (10.0, 20.0, 30.0, 60.0, 60.0, 120.0, 120.0, 300.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)


@dataclass(frozen=True)
class RecoveryPolicy:
    """The numbers behind polling, crash recovery and escalation.

    * ``not_found_window``: how long a charge must have existed before any crash-recovery
      evidence about it is believed (60 s, three rail request timeouts: it bounds how long
      a live confirm can be inside its rail call). The same window is what a streak of
      404s must span before it means "the rail never received it".
    * ``not_found_streak``: how many 404s (besides the window) before that conclusion.
    * ``horizon``: age (from ``charges.created_at``) past which a live charge escalates
      to ``unresolved`` on every non-terminal answer (24 h).
    * ``ladder``: delays between polls, by how many polls came before; the last rung repeats.
    * ``past_horizon_every``: the delay between polls past the horizon (hourly).
    * ``wait_margin``: added to a ``Wait`` so the one re-poll lands after the window, not on it.
    * ``confirm_grace``: the poll job a confirm writes is due this long after it (the
      rail request timeout), so a worker does not normally claim it while the confirm is
      inside its rail call; the confirm pulls it forward once it has an answer.
    """

    not_found_window: float = 60.0
    not_found_streak: int = 3
    horizon: float = 24 * 3600.0
    ladder: tuple[float, ...] = DEFAULT_LADDER
    past_horizon_every: float = 3600.0
    wait_margin: float = 1.0
    confirm_grace: float = 20.0

    def __post_init__(self) -> None:
        if self.not_found_window < 0 or self.horizon <= 0 or self.past_horizon_every <= 0:
            raise ValueError("the window must be non-negative, the horizon and the hourly period positive")
        if self.not_found_streak < 1:
            raise ValueError("not_found_streak must be at least 1")
        if not self.ladder or any(rung <= 0 for rung in self.ladder):
            raise ValueError("the poll ladder needs at least one positive rung")
        if self.wait_margin < 0 or self.confirm_grace < 0:
            raise ValueError("wait_margin and confirm_grace must not be negative")


def from_settings() -> RecoveryPolicy:
    """The policy the deployment configured (``VPAY_CHARGE_*`` settings)."""
    from django.conf import settings

    return RecoveryPolicy(
        not_found_window=settings.VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS,
        not_found_streak=settings.VPAY_CHARGE_NOT_FOUND_STREAK,
        horizon=settings.VPAY_CHARGE_HORIZON_SECONDS,
        ladder=tuple(settings.VPAY_CHARGE_POLL_LADDER_SECONDS),
        past_horizon_every=settings.VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS,
        wait_margin=settings.VPAY_CHARGE_WAIT_MARGIN_SECONDS,
        confirm_grace=settings.VPAY_CHARGE_CONFIRM_GRACE_SECONDS,
    )
