"""Claiming: exactly what the worker's idle executors start now, claimed by an idle executor.

There is no dispatcher thread between the claim and the start. An executor that has
nothing to run takes a job handed to it, or claims: for itself and for every other idle
executor at once (``concurrency - running`` jobs, one fair statement), keeping the first
and handing the rest over. One executor claims at a time (a lock), so the count is right
and a claim never outruns the executors; the others wait for a hand-over or their turn.
An executor with nothing to claim waits for a wake: a ``NOTIFY`` (the listener), a claim
that took more than its own job, or the idle poll. A slot freeing wakes nobody: the
executor that freed it claims next itself (a waiting suspect included). A failed claim backs off (1 s doubling
to 10 s); the worker does not exit on a database blip.

No claim while a suspect runs alone, nor while one waits to run on this worker: one worker
at a time stops claiming until what it runs has finished, then claims the suspect alone
(:meth:`Dispatcher.check_suspects`); the others claim on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from django.db import connection

from jobs.maintenance import liveness
from jobs.runner.settling import DB_ERRORS
from jobs.storage import leases
from jobs.storage.leases import ClaimedJob
from vpay import metrics
from vpay.errors import error_chain

if TYPE_CHECKING:
    from jobs.runner.worker import Worker

logger = logging.getLogger("jobs.runner.worker")

CLAIM_BACKOFF_CAP = 10.0
# A job this worker cannot run is skipped by its claims for this long (then tried again, so
# that its window, VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS, runs out when no worker can run it),
# and at most this many are remembered.
CANNOT_RUN_SECONDS = 60.0
# How long a worker draining for a suspect may take to become idle before it gives the
# role up (a hung handler), and how long it then leaves the role to other workers.
SUSPECT_DRAIN_SECONDS = 30.0
SUSPECT_DRAIN_PAUSE_SECONDS = 60.0
CANNOT_RUN_MEMORY = 1000
# After a claim for the unpaced kinds alone (the merchant-paced ones fill their executors)
# found nothing, the next such claim waits this long, or for a NOTIFY (new work), whichever
# is first. The claim steps over the tenants' due deliveries in jobs_job_ready_idx, which does
# not hold the kind: at 100,000 queued deliveries, repeating it after every delivery's
# claim cost a third of the database's time a delivery (bench/WEBHOOKS.md). A poll that comes
# due by its run_at while deliveries fill the worker starts at most this much later.
UNPACED_RECHECK_SECONDS = 0.2
# How long an executor that has connected waits for its siblings to connect before claiming
# (Dispatcher.executor_ready): a bound, so one whose connect hangs holds nobody back for long.
EXECUTORS_READY_SECONDS = 5.0


class Dispatcher:
    """Claims for one :class:`~jobs.runner.worker.Worker`, whose slots (``_running``, under
    ``_cv``) it shares with the executors."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tenant_after = ""  # where the next claim's tenant walk starts (round-robin)
        self.claim_failures = 0
        self.suspect_waiting = False  # set by the maintenance thread (check_suspects)
        self._draining_since = 0.0  # monotonic: when this worker began to drain for a suspect
        self._drain_again_after = 0.0  # monotonic: no drain before this (it gave the role up)
        self._generation = 0  # wakes so far, under worker._cv
        self._claiming = threading.Lock()  # one executor claims at a time
        self._lock_waiters = 0  # executors that found a claim running, under worker._cv
        self._unpaced_quiet_until = 0.0  # monotonic: no claim for the unpaced kinds alone before this
        self._handed: queue.SimpleQueue = queue.SimpleQueue()  # claimed for an idle executor
        self._cannot_run: dict[int, float] = {}  # job pk -> until when its claims skip it
        self._suspect_tries = 0  # --burst: suspects seen since the last claim that took something
        self._unconnected = worker.concurrency  # executors that have not yet tried to connect
        self._all_connected = threading.Event()

    def executor_ready(self) -> None:
        """An executor opens its connection, then waits (bounded) until every executor has,
        before any of them claims. A claim hands jobs to the idle executors at once; at a
        cold start one still connecting would start its job tens of milliseconds after its
        siblings (two slow jobs claimed together, one of them late). A connect that fails is
        left to the claim, which backs off while the database is away."""
        with contextlib.suppress(*DB_ERRORS):
            connection.ensure_connection()
        w = self.worker
        with w._cv:
            self._unconnected -= 1
            if self._unconnected <= 0:
                self._all_connected.set()
        self._all_connected.wait(EXECUTORS_READY_SECONDS)

    def next_job(self) -> ClaimedJob | None:
        """The next job for the calling (idle) executor; None once the worker stops."""
        w = self.worker
        while not w._stopping.is_set():
            # The generation first: a hand-over and its wake landing after the look at the
            # queue then end the wait below at once instead of after the idle poll.
            with w._cv:
                generation = self._generation
            try:
                return self._handed.get_nowait()
            except queue.Empty:
                pass
            with w._cv:
                may = self._may_claim()
            if may and not self._claiming.acquire(blocking=False):
                # Another executor's claim is running: wait for it to end (it wakes the
                # waiters whatever it found), not for the idle poll. A claim that came up
                # empty used to wake nobody, and a futile claim (the reserved executor's for
                # the unpaced kinds, stepping over a tenant's 90k deliveries) left every
                # executor that finished meanwhile asleep for a second: 100k deliveries ran
                # at ~10/s instead of ~280/s (bench/WEBHOOKS.md).
                with w._cv:
                    self._lock_waiters += 1
                self._wait_for_work(generation, w.idle_sleep)
                continue
            if not may:
                self._wait_for_work(generation, w.idle_sleep)  # a hand-over, a turn, a wake
                continue
            quiet = 0.0
            try:
                with w._cv:
                    if not self._may_claim():
                        continue
                    free = w.concurrency - len(w._running)
                    alone = not w._running
                    # The merchant-paced kinds (webhooks) may fill all but the reserved
                    # executors; once they do, a claim takes every other kind only.
                    room = w.paced_room()
                    kinds, asked = (None, min(free, room)) if room > 0 else (w.unpaced_kinds, free)
                    if kinds is not None:
                        quiet = self._unpaced_quiet_until - time.monotonic()
                jobs = self.claim(asked, alone, kinds) if quiet <= 0 else []
                if jobs == [] and kinds is not None and quiet <= 0:
                    self._unpaced_quiet_until = time.monotonic() + UNPACED_RECHECK_SECONDS
            finally:
                self._claiming.release()
                with w._cv:
                    waiters, self._lock_waiters = self._lock_waiters, 0
                if waiters:
                    generation = self.wake(waiters)
                    # That wake is the waiters' turn, not new work for this executor: they claim
                    # next (and see whatever a NOTIFY announced meanwhile). Waiting on the older
                    # generation, an empty claim's executor came straight back to the lock,
                    # found a woken waiter claiming and waited for it in turn, which woke it
                    # again: idle executors claimed back to back, hundreds a second at idle.
                    # The generation of that wake itself, taken under its lock: any later wake
                    # (a hand-over by the claim it woke) still ends this executor's wait.
            if quiet > 0:
                self._wait_for_work(generation, min(quiet, w.idle_sleep))
                continue
            if jobs:
                self._suspect_tries = 0
                for job in jobs[1:]:
                    self._handed.put(job)
                if len(jobs) > 1 or len(jobs) == asked:
                    # The idle executors these were claimed for; and, when the claim took all
                    # it asked for (more may be due), one more, for the next claim. A claim
                    # that came up short wakes nobody else: the queue is drained, and the
                    # next NOTIFY or idle poll brings the next claim.
                    self.wake(len(jobs) - 1 + (len(jobs) == asked))
                return jobs[0]
            if jobs is None:  # the claim failed: back off
                self._wait_for_work(generation, self._backoff())
                continue
            if w.burst and w.running_count() == 0 and self.claim_failures == 0:
                if self._idle_with_suspects():
                    if self._suspect_tries:  # one it saw is locked elsewhere: not a busy loop
                        self._wait_for_work(generation, w.idle_sleep)
                    self._suspect_tries += 1
                    continue  # the next claim, alone, takes the suspect
                if w._heartbeating and self._late_holders_waiting():
                    # Jobs held by workers whose beat is late: its reaper (which waits a lease
                    # after its own start) may yet rescue them for this burst to run.
                    self._wait_for_work(generation, w.idle_sleep)
                    continue
                if self._idle_with_suspects():
                    # A rescue committed between the two looks: its jobs were still held at the
                    # first and are suspects now, their holder gone. Left, they waited for a
                    # worker that was not coming (a repeated-SIGKILL rehearsal lost seven so).
                    continue
                w._stopping.set()
                self.wake()
                return None
            self._wait_for_work(generation, w.idle_sleep)
        return None

    def unstarted(self) -> list[ClaimedJob]:
        """Jobs claimed for an executor that never took them (the worker stopped)."""
        left = []
        while True:
            try:
                left.append(self._handed.get_nowait())
            except queue.Empty:
                return left

    def _may_claim(self) -> bool:
        """Under ``worker._cv``: a slot is free, and no suspect runs or waits to run alone
        (a waiting suspect stops the claims until what runs has finished)."""
        w = self.worker
        return not w._solo and len(w._running) < w.concurrency and not (self.suspect_waiting and w._running)

    def claim(self, free: int, alone: bool, kinds: list[str] | None = None) -> list[ClaimedJob] | None:
        """Claim up to ``free`` jobs of ``kinds`` (all the worker's by default; a suspect,
        alone, when nothing runs), registered as running before this returns. None when
        the claim failed."""
        w = self.worker
        lease = w.lease_seconds if w._heartbeating else None
        try:
            jobs: list[ClaimedJob] = []
            if alone and self.suspect_waiting:
                suspect = leases.claim_suspect(
                    worker=w.worker_id,
                    queues=w.queues,
                    kinds=w.kinds,
                    lease_seconds=lease,
                    kind_leases=w._kind_leases,
                    default_lease=w._default_lease,
                )
                if suspect is not None:
                    jobs = [suspect]
                    self._draining_since = time.monotonic()  # the wait for the next one starts now
                else:
                    self._stop_draining()
            if not jobs:
                result = leases.claim(
                    worker=w.worker_id,
                    queues=w.queues,
                    kinds=w.kinds if kinds is None else kinds,
                    batch=free,
                    lease_seconds=lease,
                    kind_leases=w._kind_leases,
                    default_lease=w._default_lease,
                    after=self.tenant_after,
                    max_tenants=w.max_tenants,
                    skip=self._cannot_run_now(),
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

    def note_unrunnable(self, job_id: int) -> None:
        """This worker just handed the job back as one it cannot run: its claims leave it to
        the other workers for a while. Without this the worker that handed it back, polling in
        step with the job's own delay, would always be first to claim it again."""
        with self.worker._cv:
            if len(self._cannot_run) >= CANNOT_RUN_MEMORY:
                self._cannot_run.pop(next(iter(self._cannot_run)))
            self._cannot_run[job_id] = time.monotonic() + CANNOT_RUN_SECONDS

    def _cannot_run_now(self) -> list[int]:
        now = time.monotonic()
        with self.worker._cv:
            for job_id in [j for j, until in self._cannot_run.items() if until <= now]:
                del self._cannot_run[job_id]
            return list(self._cannot_run)

    def _idle_with_suspects(self) -> bool:
        """A --burst worker found nothing ordinary to claim and runs nothing: whether a
        suspect is due, which it then claims alone at once. The maintenance thread would
        flag it only at its next beat, after the burst had exited and left the suspect
        behind. Running nothing, it holds no one up: the drain role is not needed."""
        try:
            waiting = leases.suspect_waiting(self.worker.queues, self.worker.kinds)
        except DB_ERRORS:
            # Not knowing is not "none": back off as a failed claim does, and ask again.
            connection.close()
            self.claim_failures += 1
            return True
        if waiting:
            with self.worker._cv:
                self.suspect_waiting = True
        return waiting

    def _late_holders_waiting(self) -> bool:
        try:
            return liveness.late_holders_waiting(self.worker.worker_id)
        except DB_ERRORS:
            connection.close()
            return False

    def _backoff(self) -> float:
        return min(self.worker.idle_sleep * (2 ** min(self.claim_failures - 1, 10)), CLAIM_BACKOFF_CAP)

    def notified(self) -> None:
        """New work (a NOTIFY): one executor claims now, for any kind, whatever an empty claim
        for the unpaced kinds decided a moment ago."""
        self._unpaced_quiet_until = 0.0
        self.wake(1)

    def wake(self, executors: int | None = None) -> int:
        """A new generation, returned; ``executors``: how many idle executors it is for (all when None).
        One per job handed over, not all: waking every idle executor per claim had each of
        them take the GIL only to find the hand-over queue empty (a tenth of the worker's
        time in a no-op drain, bench/RESULTS.md). One left asleep still sees the new
        generation at its next wake or idle poll."""
        w = self.worker
        with w._cv:
            self._generation += 1
            if executors is None:
                w._cv.notify_all()
            elif executors > 0:
                w._cv.notify(executors)
            return self._generation

    def _wait_for_work(self, generation: int, timeout: float) -> None:
        """Wait for a wake newer than ``generation`` (taken before the claim, so a NOTIFY
        that arrived while it ran is not lost), a stop, or ``timeout``."""
        w = self.worker
        with w._cv:
            w._cv.wait_for(lambda: self._generation != generation or w._stopping.is_set(), timeout)

    def check_suspects(self) -> None:
        """Maintenance (every beat period): whether this worker should stop claiming so that a
        waiting suspect can run alone on it.

        One worker at a time does (``liveness.take_drain``), not every worker: a crash that
        held several jobs would otherwise drain the whole fleet to zero. The flag follows the
        truth at every check (a suspect another worker took clears it), and a worker that is
        not idle within :data:`SUSPECT_DRAIN_SECONDS` (a hung handler) gives the role up and
        claims again, leaving the suspect to another worker for a while."""
        w = self.worker
        now = time.monotonic()
        if not leases.suspect_waiting(w.queues, w.kinds):
            self._stop_draining()
            return
        if not w._heartbeating:  # the step methods: no workers row, no fleet to share with
            self.suspect_waiting = True
            self.wake()
            return
        with w._cv:
            # Waiting on its own work, not running suspects alone (that is the drain working).
            busy = bool(w._running) and not w._solo
        if self.suspect_waiting and busy and now - self._draining_since > SUSPECT_DRAIN_SECONDS:
            self._stop_draining()
            self._drain_again_after = now + SUSPECT_DRAIN_PAUSE_SECONDS
            logger.info("not idle in time for a suspect; claiming again and leaving it to another worker")
            return
        if now < self._drain_again_after:
            return
        if liveness.take_drain(w.worker_id, SUSPECT_DRAIN_SECONDS + w.heartbeat_seconds):
            if not self.suspect_waiting:
                self._draining_since = now
            self.suspect_waiting = True
            self.wake()
        else:
            self.suspect_waiting = False

    def _stop_draining(self) -> None:
        if self.suspect_waiting and self.worker._heartbeating:
            liveness.drop_drain(self.worker.worker_id)
        self.suspect_waiting = False
