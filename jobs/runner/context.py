"""What a handler receives: the job it is running and the few verbs it may use."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from jobs import registry
from jobs.primitives import cancels, checkpoints, fence
from jobs.runner.current import JobCancelled
from jobs.storage import leases
from jobs.storage.leases import ClaimedJob
from jobs.storage.rowless import rowless
from vpay.errors import TransientError


class LeaseLost(Exception):
    """The lease was taken over (reaped) while the handler ran: stop, the answer is void."""


class JobTimedOut(TransientError):
    """The handler ran past its kind's timeout: its heartbeat refuses. The job is retried
    on the kind's backoff (the attempt is spent), like any transient failure."""


_UNREAD = object()


@dataclass
class JobContext:
    """The claimed job, its deadline, and the heartbeat a long handler calls."""

    job: ClaimedJob
    timeout_seconds: float
    # The loop itself fences this kind (registry ``fenced=True``): the handler must not.
    loop_fenced: bool = False
    # How many executors the worker running this job has; None where no worker runs it
    # (tests driving a handler directly). A handler that must leave threads for other work
    # (one webhook endpoint's share) sizes itself by it.
    worker_concurrency: int | None = None
    # The id of the beating worker running this job; None where none beats (the step
    # methods, the in-process adapter). Its reaper judges others only as that worker may.
    worker_id: str | None = None
    started_monotonic: float = field(default_factory=time.monotonic)
    # The persisted cursor, read on first use (jobs.primitives.checkpoints); _UNREAD until then.
    _cursor: object = field(default=_UNREAD, repr=False)
    # Whether a transaction was already open when the job started (a test's, an embedding
    # caller's): only one opened after that is the handler's own (see heartbeat).
    _outer_atomic: bool = field(default_factory=lambda: connection.in_atomic_block, repr=False)

    @property
    def job_id(self) -> uuid.UUID:
        return self.job.job_id

    @property
    def kind(self) -> str:
        return self.job.kind

    @property
    def payload(self) -> dict:
        return self.job.payload

    @property
    def attempt(self) -> int:
        """1 on the first run (the claim counted it)."""
        return self.job.attempts

    @property
    def deferrals(self) -> int:
        """Its deferrals in a row: since its last run that made progress (which resets them)."""
        return self.job.deferrals

    @property
    def deferrals_left(self) -> int:
        """Deferrals this job may still answer before the runner dead-letters it at its
        kind's deferral ceiling (``KindSpec.max_deferrals``). A kind whose unit must never
        become a dead letter for waiting (a charge's poll) turns its deferral into another
        disposition once none are left."""
        spec = registry.get(self.kind)
        ceiling = spec.max_deferrals if spec is not None else registry.DEFAULT_MAX_DEFERRALS
        return max(ceiling - self.job.deferrals, 0)

    def remaining(self) -> float:
        """Seconds left before this job's timeout (elapsed time, not a wall clock)."""
        return self.timeout_seconds - (time.monotonic() - self.started_monotonic)

    def heartbeat(self) -> None:
        """Say the handler is alive between units of work.

        Raises :class:`JobTimedOut` once the kind's timeout has passed since the handler
        started (the heartbeat does not restart that clock: a timeout is the whole run's
        budget), :class:`~jobs.runner.current.JobCancelled` once an operator asked to cancel the
        job, and :class:`LeaseLost` if the lease was taken. A running worker's own
        heartbeat keeps every lease it holds alive; this one also extends the job's lease
        when the handler owns its transactions (a step-method test has no worker
        heartbeat). Inside a transaction (a loop-fenced handler's, or one the handler opened)
        the job row must not be written (its lock would be held until the commit, and
        cancels, hand-backs and the reaper would wait on it), so there it only reads the
        cancel flag (one primary-key SELECT).
        """
        if self.remaining() < 0:
            raise JobTimedOut(
                f"job {self.job.job_id} ({self.job.kind}) ran past its {self.timeout_seconds:g} s timeout"
            )
        if rowless(self.job):  # an in-process job has no row: no lease to extend, no request to read
            return
        if self.loop_fenced or (connection.in_atomic_block and not self._outer_atomic):
            # Inside a transaction (the loop's, or one the handler opened) an UPDATE of the job
            # row would hold its lock until that commits: cancels, hand-backs and the reaper
            # would wait on it. The worker's beat keeps the lease; read the cancel flag only.
            cancel_requested = cancels.requested(self.job.id, self.job.lease_token)
        else:
            cancel_requested = leases.heartbeat(self.job.id, self.job.lease_token, self.job.lease_seconds)
        self._obey(cancel_requested)

    @property
    def cursor(self) -> Any:
        """Where the previous run of this job got to (its last :meth:`checkpoint`), or None
        on a fresh pass. After a checkpoint in this run, that cursor, as JSON reads it back."""
        if self._cursor is _UNREAD:
            self._cursor = None if rowless(self.job) else checkpoints.stored(self.job.id, self.job.lease_token)
        return self._cursor

    def checkpoint(self, cursor: object) -> None:
        """A heartbeat that also persists ``cursor`` (JSON, small: ``jobs.primitives.checkpoints``) in
        the same statement; ``None`` clears it, so the next run starts a new pass. Call it
        once the work up to ``cursor`` has committed. Raises what :meth:`heartbeat` raises,
        the cursor stored first (a run past its timeout keeps its progress for the retry),
        and :class:`~jobs.primitives.checkpoints.CheckpointRefused` in a loop-fenced kind, whose work
        commits only at the end of its body. An in-process job keeps it in memory only."""
        if self.loop_fenced:
            raise checkpoints.CheckpointRefused(
                f"kind {self.job.kind!r} is fenced by the loop: its work commits only when the body ends, "
                "so a checkpoint could outrun a rollback; it has nothing to resume"
            )
        text = checkpoints.encode(cursor)
        self._cursor = None if text is None else checkpoints.decode(text)
        if rowless(self.job):
            cancel_requested: bool | None = False
        else:
            cancel_requested = leases.heartbeat(
                self.job.id, self.job.lease_token, self.job.lease_seconds, checkpoint=text
            )
        if cancel_requested is not None and self.remaining() < 0:
            raise JobTimedOut(
                f"job {self.job.job_id} ({self.job.kind}) ran past its {self.timeout_seconds:g} s timeout"
            )
        self._obey(cancel_requested)

    def _obey(self, cancel_requested: bool | None) -> None:
        if cancel_requested is None:
            raise LeaseLost(f"lease on job {self.job.job_id} was taken over")
        if cancel_requested:
            raise JobCancelled(self.job.job_id)

    def first_time(self, subject: str = "") -> bool:
        """The fence for this job; see :func:`jobs.primitives.fence.first_time`."""
        if self.loop_fenced:
            # The loop inserts this job's fence row after the body; a row inserted here
            # would make the loop see a duplicate and roll the effect back.
            raise RuntimeError(f"kind {self.job.kind!r} is fenced by the loop; its handler must not call first_time()")
        return fence.first_time(self.job.job_id, self.job.kind, subject)
