"""What a handler receives: the job it is running and the few verbs it may use."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from jobs import fence, repository
from jobs.repository import ClaimedJob


class LeaseLost(Exception):
    """The lease was taken over (reaped) while the handler ran: stop, the answer is void."""


@dataclass
class JobContext:
    """The claimed job, its deadline, and the heartbeat a long handler calls."""

    job: ClaimedJob
    timeout_seconds: float
    # The loop itself fences this kind (registry ``fenced=True``): the handler must not.
    loop_fenced: bool = False
    # How many loop threads the worker running this job has; None where no worker runs it
    # (tests driving a handler directly). A handler that must leave threads for other work
    # (one webhook endpoint's share) sizes itself by it.
    worker_concurrency: int | None = None
    started_monotonic: float = field(default_factory=time.monotonic)

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

    def remaining(self) -> float:
        """Seconds left before this job's timeout (elapsed time, not a wall clock)."""
        return self.timeout_seconds - (time.monotonic() - self.started_monotonic)

    def heartbeat(self) -> None:
        """Extend the lease by a full lease from now. Raises :class:`LeaseLost` if it was taken.

        Long handlers call this between units of work; the timeout clock restarts too.
        (Handlers of loop-fenced kinds run inside the loop's transaction, where the new
        expiry is invisible to reapers until commit: they keep to their timeout instead.)
        """
        if not repository.heartbeat(self.job.id, self.job.lease_token, self.job.lease_seconds):
            raise LeaseLost(f"lease on job {self.job.job_id} was taken over")
        self.started_monotonic = time.monotonic()

    def first_time(self, subject: str = "") -> bool:
        """The fence for this job; see :func:`jobs.fence.first_time`."""
        if self.loop_fenced:
            # The loop inserts this job's fence row after the body; a row inserted here
            # would make the loop see a duplicate and roll the effect back.
            raise RuntimeError(f"kind {self.job.kind!r} is fenced by the loop; its handler must not call first_time()")
        return fence.first_time(self.job.job_id, self.job.kind, subject)
