"""``sweep_expired``: the hourly housekeeping singleton of the queue.

Independent statements, each its own transaction (autocommit), so one failing does not
roll back the others: expired ``processed_jobs`` rows (in pages) and expired job leases.
The lease reap is here as well as in every worker because a job cannot recover its own
lease: when the only worker dies holding this job, the next worker's boot reaper frees it.
Later apps add their own expiries with :func:`register_sweep_step`; ``jobs`` imports none
of them. A step that fails (or skips rows) on ``SWEEP_STEP_ALERT_AFTER`` consecutive passes
alerts once (``jobs.maintenance.sweep_health``).

The sweep's checkpoint is one cursor per step that pages by keyset (``jobs.maintenance.paging``), kept
under the step's name: each step sees its own as ``ctx.cursor`` (:class:`StepContext`), so
a pass that crashed or rescheduled ``more`` resumes every step where it stopped. Steps
that delete the head of their table page after page (fences, idempotency records) need
none: what they retired is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from jobs import registry
from jobs.kinds import JobKind
from jobs.maintenance import sweep_health
from jobs.maintenance.thread import reap
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext, JobTimedOut, LeaseLost
from jobs.runner.current import JobCancelled
from jobs.runner.outcome import Outcome
from jobs.storage import fence_sql
from vpay.errors import error_chain

SWEEP_STEP_ALERT_AFTER = sweep_health.SWEEP_STEP_ALERT_AFTER
STEP_NAME_MAX = 100  # sweep_step_streaks.step

logger = logging.getLogger(__name__)

SWEEP_EVERY_SECONDS = 3600.0
FENCE_PAGE = 1000
MAX_FENCE_PAGES = 100  # at most 100k fence rows a pass; the next pass continues


class StepResult(NamedTuple):
    """What one sweep step did: rows it retired, and whether a full page made progress."""

    count: int  # type: ignore[assignment]  # shadows tuple.count(); every caller reads the field
    more: bool = False
    failed: int = 0
    """Rows that failed and were skipped (already logged by id at WARN)."""


class StepContext:
    """The sweep's JobContext as one step sees it: ``cursor`` and ``checkpoint`` are that
    step's own entry in the sweep's checkpoint; everything else is the job's."""

    def __init__(self, ctx: JobContext, name: str, cursors: dict[str, Any]) -> None:
        self._ctx, self._name, self._cursors = ctx, name, cursors

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._ctx, attr)

    @property
    def cursor(self) -> Any:
        return self._cursors.get(self._name)

    def checkpoint(self, cursor: Any) -> None:
        if cursor is None:
            self._cursors.pop(self._name, None)
        else:
            self._cursors[self._name] = cursor
        # One row for the sweep: every step's cursor, or none once all passes ended.
        self._ctx.checkpoint(dict(self._cursors) or None)


SweepStep = Callable[[JobContext], StepResult]
_STEPS: dict[str, SweepStep] = {}


def register_sweep_step(name: str, step: SweepStep) -> None:
    """Add ``step`` to the hourly ``sweep_expired`` pass under ``name`` (its log count key).

    A step owns its transactions (one per row or per statement, never one for the pass),
    so its failure rolls back only itself: the sweep logs it at WARN and runs the others.
    What the heartbeat raises to stop the run (lease lost, cancel, timeout) stops the pass.
    A step answers ``more=True`` only when a full page made progress; the sweep then
    reschedules at once instead of an hour out, so a backlog drains in one run while a
    page that made no progress cannot become a hot loop. Call it from ``AppConfig.ready``.
    """
    if name in _STEPS or name in _BUILT_IN:
        raise RuntimeError(f"sweep step {name!r} is already registered")
    if not name or len(name) > STEP_NAME_MAX:
        raise ValueError(f"a sweep step's name is 1 to {STEP_NAME_MAX} characters (its failure streak's key)")
    _STEPS[name] = step


def sweep_steps() -> dict[str, SweepStep]:
    """Every step of a pass, the queue's own first, in registration order."""
    return {**_BUILT_IN, **_STEPS}


def delete_in_rounds(ctx: JobContext, delete_page: Callable[[int], int], *, page: int, rounds: int) -> StepResult:
    """A step that deletes expired rows a page per statement (``delete_page(page)`` returns how
    many it deleted), heartbeating between pages, until a page comes up short or ``rounds``
    pages are done (then ``more``: run again soon, not in an hour)."""
    total = 0
    for _ in range(rounds):
        deleted = delete_page(page)
        total += deleted
        if deleted < page:
            return StepResult(total)
        ctx.heartbeat()
    return StepResult(total, more=True)


def _expired_fences(ctx: JobContext) -> StepResult:
    return delete_in_rounds(ctx, fence_sql.delete_expired_fences, page=FENCE_PAGE, rounds=MAX_FENCE_PAGES)


def _expired_leases(ctx: JobContext) -> StepResult:
    # As the worker running it would: a reaper just back from an outage judges nobody yet.
    released, buried = reap(ctx.worker_id or "", beating=ctx.worker_id is not None)
    if buried:
        logger.warning("sweep dead-lettered jobs out of attempts", extra={"leases_dead_lettered": buried})
    return StepResult(released + buried)


def _stops_the_run(exc: Exception, ctx: JobContext) -> bool:
    """What the heartbeat raises to stop the whole run, not one step: the lease is gone
    (another worker may already run this job), an operator cancelled it, or its timeout is
    spent. A pass that went on would work without a lease. A ``JobCancelled`` a step raised
    of its own accord names no job: that is a step failure (``jobs.runner.current``)."""
    if isinstance(exc, JobCancelled):
        return exc.job_id == ctx.job_id
    return isinstance(exc, (LeaseLost, JobTimedOut))


_BUILT_IN: dict[str, SweepStep] = {"processed_jobs": _expired_fences, "leases": _expired_leases}


@registry.register(
    JobKind.SWEEP_EXPIRED,
    schema=PayloadSchema(),
    timeout_seconds=300.0,
    singleton=registry.Singleton(),
)
def sweep_expired(ctx: JobContext) -> Outcome:
    """One pass: every step, each isolated; one log line with every count."""
    steps = sweep_steps()
    counts: dict[str, int] = {}
    failed: list[Exception] = []
    more = False
    # Cursors of steps no longer registered are dropped with the next checkpoint.
    cursors = {name: c for name, c in (ctx.cursor or {}).items() if name in steps}
    for name, step in steps.items():
        try:
            result = step(StepContext(ctx, name, cursors))  # type: ignore[arg-type]
        except Exception as exc:  # one step's failure must not stop the others
            if _stops_the_run(exc, ctx):
                logger.info("sweep pass stopped", extra={"step": name, "error": error_chain(exc, 300)})
                raise
            failed.append(exc)
            logger.warning("sweep step failed", extra={"step": name, "error": error_chain(exc, 300)})
            sweep_health.step_failed(name, error_chain(exc, 1000))
            continue
        counts[name] = result.count
        if result.failed:
            counts[f"{name}_failed"] = result.failed
            sweep_health.step_failed(name, f"{result.failed} row(s) failed and were skipped")
        else:
            sweep_health.step_succeeded(name)
        more = more or result.more
        ctx.heartbeat()
    logger.info("sweep_expired", extra={"counts": counts, "failed_steps": len(failed)})
    if len(failed) == len(steps):  # nothing worked: let the retry policy see it
        raise failed[0]
    if more:
        return Outcome.reschedule_in(0, "a full page made progress")
    return Outcome.reschedule_in(SWEEP_EVERY_SECONDS)  # the singleton's row lives on, an hour out
