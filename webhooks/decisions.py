"""The pure decision tables of webhook delivery: the retry ladder, the fan-out disposition
and when a transiently failing event alerts.

No database and no settings here: callers pass the schedule (``VPAY_WEBHOOK_RETRY_SCHEDULE``)
and the counts they read, so every cell is unit-tested without Postgres.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from jobs.primitives.ask_again import Ladder

# Roughly 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: eight tries over about 27.6 hours, so a
# receiver that is down for a day still gets its events once it is back.
DEFAULT_SCHEDULE: tuple[float, ...] = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
FAN_OUT_MAX_PASSES = 5
# Passes an event may fail *transiently* (the database, not the event) before one alert says
# it is stuck. It is never abandoned for them: at the idle cadence (5 s) about five minutes,
# longer than a migration's lock should be held, and sooner when other events make progress.
FAN_OUT_TRANSIENT_ALERT_AFTER = 60


def delivery_delay(attempt: int, schedule: Sequence[float] = DEFAULT_SCHEDULE) -> float | None:
    """Seconds to wait after failed attempt number ``attempt`` (1-based), or ``None``: exhausted.

    ``None`` rather than a last rung because "the ladder ran out" is the ``exhausted``
    transition of the delivery and must not be expressible as one more delay: a delivery
    that kept rescheduling forever would be a queue that never drains. This is not the
    job retry policy (``jobs.primitives.retry``): a merchant's 500 is not a rail failure and shares
    nothing with it.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    # The runner's poll-with-backoff primitive; the schedule stays the delivery's own.
    return Ladder.of(schedule).next_wait(attempt)


def parse_schedule(text: str) -> tuple[float, ...]:
    """``VPAY_WEBHOOK_RETRY_SCHEDULE``: comma-separated non-negative seconds, at least one rung."""
    rungs = tuple(float(part) for part in text.split(",") if part.strip())
    if not rungs or any(r < 0 or r != r or r == float("inf") for r in rungs):
        raise ValueError("the webhook retry schedule needs at least one finite, non-negative number of seconds")
    return rungs


class FanOut(enum.Enum):
    """What a fan-out pass does with an event it failed to fan out (after counting the failure)."""

    RETRY = "retry"
    """Still pending: the next pass tries again."""
    ABANDON = "abandon"
    """That was the last allowed pass: move it to ``abandoned`` and alert, once."""
    NOT_PENDING = "not_pending"
    """A concurrent drain fanned it out (or it was abandoned) meanwhile: neither retry nor alert."""


def fan_out_disposition(failures: int | None, max_passes: int = FAN_OUT_MAX_PASSES) -> FanOut:
    """The disposition of a failed event, from its failure counter after this failure was counted.

    ``failures`` is ``None`` when the counting statement matched no pending row: someone
    else moved the event out of ``pending`` between our failure and our count.
    """
    if failures is None:
        return FanOut.NOT_PENDING
    if failures >= max_passes:
        return FanOut.ABANDON
    return FanOut.RETRY


def stuck_alert_due(transient_failures: int | None, alert_after: int = FAN_OUT_TRANSIENT_ALERT_AFTER) -> bool:
    """Whether this transient failure, counted as ``transient_failures``, is the one that
    alerts: exactly the pass that reaches the bound, so an event stuck for a day costs one
    alert, not one per pass (None: no longer pending, nothing to say)."""
    return transient_failures is not None and transient_failures == alert_after


class AttemptResult(enum.Enum):
    """What one HTTP try amounted to (the attempt row's final state, before the lease check)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # heard a refusal: non-2xx (3xx included: redirects are not followed)
    NO_RESPONSE = "no_response"  # sent (or tried to) and nothing came back: status_code NULL


def attempt_result(status_code: int | None) -> AttemptResult:
    """2xx is success; any other status a heard refusal; no status at all is no response."""
    if status_code is None:
        return AttemptResult.NO_RESPONSE
    if 200 <= status_code < 300:
        return AttemptResult.SUCCEEDED
    return AttemptResult.FAILED


class Next(enum.Enum):
    """Where a delivery goes after an attempt that did not succeed."""

    RETRY = "pending"
    EXHAUSTED = "exhausted"


def after_failure(attempts: int, schedule: Sequence[float]) -> tuple[Next, float | None]:
    """The delivery's next state after its ``attempts``-th try failed, and the delay if any."""
    delay = delivery_delay(attempts, schedule)
    return (Next.EXHAUSTED, None) if delay is None else (Next.RETRY, delay)
