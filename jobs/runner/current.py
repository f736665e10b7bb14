"""``current_job()``: the :class:`~jobs.runner.context.JobContext` of the job running on this thread.

Code deep inside a job (an application ``@task``, a helper a handler calls) reaches the
runner through ``from jobs import current_job`` instead of having the context threaded
through every call. ``jobs.runner.invoke`` binds it around the handler call, on the executor
thread that runs it; outside a job it raises :class:`NoCurrentJob`. A leaf module (no
Django import), so ``jobs/__init__.py`` can export it before the app registry is ready.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.runner.context import JobContext


class JobCancelled(Exception):
    """An operator cancelled the running job: ``heartbeat()`` raises it once the request is
    recorded. Let it propagate: the runner settles the job as cancelled (a dead letter with
    cause ``cancelled`` and who and why), after rolling back a fenced job's transaction.

    Only the heartbeat's, naming the job it runs, counts as obeying a cancel; one a handler
    raises of its own accord names no job and fails the run like any other error."""

    def __init__(self, job_id=None) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was cancelled by an operator" if job_id else "cancelled")


class NoCurrentJob(RuntimeError):
    """``current_job()`` was called on a thread that is not running a job's handler."""


_local = threading.local()


def current_job() -> JobContext:
    """The context of the job whose handler runs on this thread."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise NoCurrentJob(
            "current_job() is only available inside a job's handler (a worker running a job, or a task it runs)"
        )
    return ctx


@contextmanager
def bound(ctx: JobContext) -> Iterator[JobContext]:
    """Make ``ctx`` this thread's current job for the duration of the block."""
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous
