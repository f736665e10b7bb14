"""The dispatcher thread: claim exactly what the worker's idle executors start now.

It waits for a free executor (none while a suspect runs alone, and none while one waits
to), claims ``concurrency - running`` jobs in one fair statement, registers them as
running and hands them to the executors. It claims again at once when the claim filled
every free slot (more may be waiting), else waits for a wake: a ``NOTIFY`` (the listener),
a slot freeing, or the idle poll. A failed claim backs off (1 s doubling to 10 s); the
worker does not exit on a database blip.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db import connection

from jobs import leases
from jobs.leases import ClaimedJob
from jobs.settling import DB_ERRORS
from vpay import metrics
from vpay.errors import error_chain

if TYPE_CHECKING:
    from jobs.worker import Worker

logger = logging.getLogger("jobs.worker")

CLAIM_BACKOFF_CAP = 10.0


class Dispatcher:
    """Claims for one :class:`~jobs.worker.Worker`, whose slots (``_running``, under
    ``_cv``) it shares with the executors."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tenant_after = ""  # where the next claim's tenant walk starts (round-robin)
        self.claim_failures = 0
        self.suspect_waiting = False  # set by the maintenance thread (check_suspects)
        self._generation = 0  # wakes so far, under worker._cv

    def run(self) -> None:
        w = self.worker
        try:
            while not w._stopping.is_set():
                with w._cv:
                    w._cv.wait_for(self._may_claim)
                    if w._stopping.is_set():
                        return
                    free = w.concurrency - len(w._running)
                    alone = not w._running
                    generation = self._generation
                jobs = self.claim(free, alone)
                if jobs is None:  # the claim failed: back off
                    self._wait_for_work(generation, self._backoff())
                    continue
                for job in jobs:
                    w._handoff.put(job)
                if jobs and (len(jobs) == free or jobs[0].suspect):
                    continue  # more may be waiting: claim again once a slot frees
                if w.burst and not jobs and w.running_count() == 0 and self.claim_failures == 0:
                    w._stopping.set()
                    return
                self._wait_for_work(generation, w.idle_sleep)
        finally:
            connection.close()

    def _may_claim(self) -> bool:
        """Under ``worker._cv``: a slot is free, and no suspect runs or waits to run alone
        (a waiting suspect stops the claims until what runs has finished)."""
        w = self.worker
        if w._stopping.is_set():
            return True
        return not w._solo and len(w._running) < w.concurrency and not (self.suspect_waiting and w._running)

    def claim(self, free: int, alone: bool) -> list[ClaimedJob] | None:
        """Claim up to ``free`` jobs (a suspect, alone, when nothing runs), registered as
        running before this returns. None when the claim failed."""
        w = self.worker
        lease = w.lease_seconds if w._heartbeating else None
        try:
            jobs: list[ClaimedJob] = []
            if alone and self.suspect_waiting:
                suspect = leases.claim_suspect(
                    worker=w.worker_id,
                    queues=w.queues,
                    lease_seconds=lease,
                    kind_leases=w._kind_leases,
                    default_lease=w._default_lease,
                )
                if suspect is not None:
                    jobs = [suspect]
                else:
                    self.suspect_waiting = False
            if not jobs:
                result = leases.claim(
                    worker=w.worker_id,
                    queues=w.queues,
                    batch=free,
                    lease_seconds=lease,
                    kind_leases=w._kind_leases,
                    default_lease=w._default_lease,
                    after=self.tenant_after,
                    max_tenants=w.max_tenants,
                )
                jobs = result.jobs
                if jobs:
                    self.tenant_after = result.next_after
        except DB_ERRORS as exc:
            # Postgres briefly unreachable is what this retry exists for; exiting would turn
            # a blip into a restart loop.
            self.claim_failures += 1
            metrics.CLAIM_FAILURES.inc()
            logger.warning(
                "claim failed; retrying after backoff",
                extra={"error": error_chain(exc, 500), "consecutive_failures": self.claim_failures},
            )
            connection.close()
            return None
        self.claim_failures = 0
        if jobs:
            w.register(jobs)
        return jobs

    def _backoff(self) -> float:
        return min(self.worker.idle_sleep * (2 ** min(self.claim_failures - 1, 10)), CLAIM_BACKOFF_CAP)

    def wake(self) -> None:
        w = self.worker
        with w._cv:
            self._generation += 1
            w._cv.notify_all()

    def _wait_for_work(self, generation: int, timeout: float) -> None:
        """Wait for a wake newer than ``generation`` (taken before the claim, so a NOTIFY
        that arrived while it ran is not lost), a stop, or ``timeout``."""
        w = self.worker
        with w._cv:
            w._cv.wait_for(lambda: self._generation != generation or w._stopping.is_set(), timeout)

    def check_suspects(self) -> None:
        """Maintenance: note whether a suspect waits, for the next claim."""
        if leases.suspect_waiting(self.worker.queues):
            self.suspect_waiting = True
            self.wake()
