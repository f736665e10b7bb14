"""The in-process queue adapter: jobs run at commit, in this process, and die with it.

For embedding vpay and for single-process development (``VPAY_QUEUE_ADAPTER=inprocess``;
live mode refuses it, vpay/settings.py). **Not durable**: a job lives in this process's
memory from the commit that enqueued it until it settles; a restart, a crash or a deploy
loses every job waiting or running, and no other process sees them.

What it keeps of the port's contract (``jobs.port``, tested by tests/test_queue_port.py on
both adapters):

* a job enqueued inside a transaction is handed over by ``transaction.on_commit``: it runs
  after the commit, never after a rollback; outside a transaction, at once;
* a deterministic name (``dedupe_key``) is live from the commit until the job settles for
  good (finished, dead), and a second enqueue of a live name is a no-op, as in PostgreSQL;
  a name enqueued twice in one transaction is handed over once;
* each job runs through the runner's own code path (``jobs.runner.invoke.run_job``, the same
  JobContext, timeouts, decisions table), and its :class:`~jobs.runner.decisions.Settle` is
  applied here: retries on the kind's backoff (attempt spent), reschedules (attempts
  reset), deferrals (attempt refunded, up to the kind's deferral ceiling), dead letters
  (logged with ``alert=true``: there is no dead-letter row to keep);
* so a job is delivered at least once while this process lives, and not at all after.

The adapter the configuration builds (``jobs.port.adapter()``) also keeps the registered
singletons (the outbox drain, the delivery scan, the sweeps, the charges backstop) in this
process, seeded when it is built, as ``runworker`` seeds their rows: without them an event
would never be fanned out unless a worker ran beside it. A singleton that ends for good
(finished, dead-lettered) is seeded again a beat later, as the worker's maintenance thread
re-creates a missing row. Adapters built directly (the conformance suite) keep none.

One daemon thread, ``vpay-inprocess``, runs the due jobs one at a time on its own database
connection (closed after each job). Delays are measured on this process's monotonic clock:
with no row, the database has nothing to schedule.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection, transaction

from jobs import registry
from jobs.adapters import postgres as queue
from jobs.adapters.postgres import Held, JobRequest
from jobs.kinds import JobKind
from jobs.runner.decisions import AttemptsChange, Disposition, Settle
from jobs.storage.leases import ClaimedJob
from jobs.storage.rowless import ROWLESS_ID

logger = logging.getLogger("jobs.adapters.inprocess")

NOT_DURABLE = (
    "VPAY_QUEUE_ADAPTER=inprocess: jobs run in this process at commit and are NOT durable; "
    "a job waiting or running dies with the process (development and embedding only)"
)
# A job whose database went away under it is handed back after this long (its attempt refunded).
RELEASE_DELAY_SECONDS = 1.0
# A singleton that ended for good comes back after this long (runworker's beat re-seeds as often).
SINGLETON_RESEED_SECONDS = 5.0


@dataclass(eq=False)
class _Job:
    """A job in memory: what a row would hold."""

    job_id: uuid.UUID
    kind: str
    queue: str
    payload_json: str = field(repr=False)  # application data: out of reprs; decoded afresh per run
    priority: int
    max_attempts: int
    name: str
    correlation_id: str
    tenant: str
    delay: float  # seconds after the commit that it is first due
    due: float = 0.0  # on this process's monotonic clock, from the commit on
    attempts: int = 0
    deferrals: int = 0
    seq: int = 0  # the heap entry that is current; older entries are stale
    running: bool = False
    woken: bool = False  # pulled forward while it ran: a plain reschedule or a finish runs it at once


class _AtCommit:
    """The ``on_commit`` callback handing one job over; named so a second enqueue of the same
    name in the same transaction can find it among the pending callbacks."""

    def __init__(self, adapter: InProcessQueue, job: _Job) -> None:
        self.adapter, self.job = adapter, job

    def __call__(self) -> None:
        self.adapter._commit(self.job)


class InProcessQueue:
    """See the module docstring."""

    name = "inprocess"
    durable = False

    def __init__(self, *, singletons: bool = False) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, int, _Job]] = []  # (due, priority order, seq, job)
        self._live: dict[str, _Job] = {}
        self._seq = itertools.count(1)
        self._running = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead_letters: list[tuple[str, str, str]] = []  # (name, cause, error): this process's only record
        # name -> kind of the singletons this adapter keeps alive (see the module docstring)
        self._singletons: dict[str, str] = {}
        if singletons:
            self._singletons = {
                spec.singleton.dedupe_key(spec.kind.value): spec.kind.value
                for spec in registry.all_specs()
                if spec.singleton is not None
            }
            with self._cv:
                for name in self._singletons:
                    self._seed(name, 0.0)
                self._start()

    # --- the port ---------------------------------------------------------------------------

    def enqueue(
        self,
        kind: JobKind | str,
        payload: Mapping,
        *,
        dedupe_key: str,
        delay: timedelta | float | None = None,
        queue: str = "default",
        priority: int = 0,
        tenant: str | None = None,
        correlation_id: str | None = None,
        max_attempts: int | None = None,
    ) -> uuid.UUID | None:
        request = JobRequest(
            kind, payload, None, dedupe_key, delay, queue, priority, tenant, correlation_id, max_attempts
        )
        return self._admit(request)

    def enqueue_many(self, requests: Iterable[JobRequest]) -> int:
        requests = list(requests)
        for request in requests:  # all validated first: one bad request hands over nothing
            _check(request)
        return sum(self._admit(r) is not None for r in requests)

    def pull_forward(self, dedupe_key: str, floor: timedelta | float = 0) -> bool:
        floor = floor.total_seconds() if isinstance(floor, timedelta) else float(floor)
        with self._cv:
            job = self._live.get(dedupe_key)
            if job is not None and job.running and floor <= 0:
                job.woken = True  # as a leased row is woken (jobs.storage.pull_forward_sql)
                return True
            return self._move_waiting(job, floor)

    def run_again(self, dedupe_key: str) -> bool:
        with self._cv:
            job = self._live.get(dedupe_key)
            if job is None or (job.running and job.woken):
                return False
            if job.running:
                job.woken = True
            elif job.due > time.monotonic():
                job.due = time.monotonic()
                self._push(job)
            return True

    def hold_waiting(self, dedupe_keys: list[str], hold: timedelta | float) -> Held:
        return Held([], "")  # every job here runs on its own, at commit: nothing is held for another

    def settle_held(self, settles, held: Held) -> int:
        return 0

    def pull_forward_waiting(
        self, dedupe_keys: list[str], limit: int = 1, floor: timedelta | float = 0, *, deferred_only: bool = False
    ) -> list[str]:
        floor = floor.total_seconds() if isinstance(floor, timedelta) else float(floor)
        moved: list[str] = []
        with self._cv:
            for name in dedupe_keys:
                if len(moved) >= limit:
                    break
                job = self._live.get(name)
                if deferred_only and (job is None or job.deferrals <= 0):
                    continue
                if self._move_waiting(job, floor):
                    moved.append(name)
        return moved

    def _move_waiting(self, job: _Job | None, floor: float) -> bool:
        """Under the lock: a waiting job due more than ``floor`` from now, made due now."""
        now = time.monotonic()
        if job is None or job.running or job.due - now <= floor:
            return False
        job.due = now
        self._push(job)
        return True

    # --- admission and hand-over --------------------------------------------------------------

    def _admit(self, request: JobRequest) -> uuid.UUID | None:
        row = _check(request)
        name = row[7]
        if self._live_name(name) or _pending_in_this_transaction(name):
            return None
        job = self._job(row, name)
        transaction.on_commit(_AtCommit(self, job))
        return job.job_id

    def _seed(self, name: str, delay: float) -> None:
        """Under the lock: the singleton ``name``, due in ``delay`` seconds, unless it is live."""
        if name in self._live:
            return
        spec = registry.get(self._singletons[name])
        assert spec is not None and spec.singleton is not None  # _singletons holds registered singleton kinds only
        row = _check(JobRequest(spec.kind, spec.singleton.payload, dedupe_key=name))
        job = self._job(row, name)
        job.due = time.monotonic() + delay
        self._live[name] = job
        self._push(job)

    def _job(self, row: tuple, name: str) -> _Job:
        return _Job(
            job_id=uuid.uuid4(),
            kind=row[1],
            queue=row[2],
            payload_json=row[3],
            priority=row[4],
            max_attempts=row[6],
            name=name,
            correlation_id=row[8],
            tenant=row[9],
            delay=row[5],
        )

    def _live_name(self, name: str) -> bool:
        with self._cv:
            return name in self._live

    def _commit(self, job: _Job) -> None:
        with self._cv:
            if job.name in self._live:
                return  # another transaction's commit handed this name over first
            job.due = time.monotonic() + job.delay
            self._live[job.name] = job
            self._push(job)
            self._start()

    def _push(self, job: _Job) -> None:
        job.seq = next(self._seq)
        heapq.heappush(self._heap, (job.due, job.priority, job.seq, job))
        self._cv.notify_all()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="vpay-inprocess", daemon=True)
            self._thread.start()

    # --- the runner's side --------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                job = self._next_due()
                if job is None:
                    return
                job.running, job.woken, self._running = True, False, self._running + 1
            try:
                settle = self._run(job)
            except Exception:  # a bug here must not end the thread and strand every job
                logger.exception("in-process job could not be run; retrying it", extra={"kind": job.kind})
                settle = Settle(Disposition.RELEASED, RELEASE_DELAY_SECONDS, AttemptsChange.REFUND)
            finally:
                connection.close()
            with self._cv:
                job.running, self._running = False, self._running - 1
                self._apply(job, settle)
                self._cv.notify_all()

    def _next_due(self) -> _Job | None:
        """Under the lock: the next due job (waiting for it), or None when stopping."""
        while not self._stopping:
            while self._heap and self._heap[0][3].seq != self._heap[0][2]:
                heapq.heappop(self._heap)  # stale: the job was pulled forward or settled
            if self._heap and self._heap[0][0] <= time.monotonic():
                return heapq.heappop(self._heap)[3]
            self._cv.wait(timeout=None if not self._heap else max(self._heap[0][0] - time.monotonic(), 0.001))
        return None

    def _run(self, job: _Job) -> Settle:
        from jobs.models import ProcessedJob
        from jobs.runner.invoke import run_job

        spec = registry.get(job.kind)
        job.attempts += 1  # as a claim counts the attempt starting
        claimed = ClaimedJob(
            id=ROWLESS_ID,
            job_id=job.job_id,
            kind=job.kind,
            queue=job.queue,
            payload=json.loads(job.payload_json),
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            deferrals=job.deferrals,
            lease_token=uuid.uuid4(),
            lease_seconds=spec.lease_seconds if spec is not None else registry.LEASE_MARGIN_SECONDS,
            tenant=job.tenant,
            correlation_id=job.correlation_id,
            processed=bool(spec and spec.fenced and ProcessedJob.objects.filter(job_id=job.job_id).exists()),
        )
        # No other process could ever run what this one cannot: poison at once.
        return run_job(claimed, [], concurrency=1, unrunnable_window=0).settle

    def _apply(self, job: _Job, settle: Settle) -> None:
        """Under the lock: what a settle write would do to the row, done to the job in memory."""
        d = settle.disposition
        if d is Disposition.FINISHED and job.woken and not registry.is_fenced(job.kind):
            # Woken while it ran: its name runs again at once (as _FINISH_MANY inserts it again).
            job.attempts = job.deferrals = 0
            job.due = time.monotonic()
            self._push(job)
            return
        if d in (Disposition.FINISHED, Disposition.LOST, Disposition.DEAD_LETTERED, Disposition.CANCELLED):
            self._live.pop(job.name, None)
            if d is Disposition.DEAD_LETTERED:
                cause = settle.cause.value if settle.cause else ""
                self.dead_letters.append((job.name, cause, settle.error))
                logger.error(
                    "in-process job dead-lettered (kept nowhere: the in-process queue is not durable)",
                    extra={"kind": job.kind, "job_id": str(job.job_id), "cause": cause, "alert": True},
                )
            if job.name in self._singletons:
                self._seed(job.name, SINGLETON_RESEED_SECONDS)  # never left without its drain or sweep
            return
        if settle.attempts is AttemptsChange.RESET:
            job.attempts = 0
            job.deferrals = 0  # as jobs.storage.repository's _RESCHEDULE: a run that made progress
        elif settle.attempts is AttemptsChange.REFUND:
            job.attempts = max(job.attempts - 1, 0)
        if settle.add_deferral:
            job.deferrals += 1
        delay = RELEASE_DELAY_SECONDS if d is Disposition.RELEASED else settle.delay
        if d is Disposition.RESCHEDULED and job.woken:
            delay = 0.0
        job.due = time.monotonic() + delay
        self._push(job)

    # --- for tests and embedding ----------------------------------------------------------------

    def wait_idle(self, timeout: float = 10.0, *, within: float = 0.0) -> bool:
        """Wait until nothing runs and nothing is due within ``within`` seconds; returns
        whether that happened before ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                now = time.monotonic()
                due = [e for e in self._heap if e[3].seq == e[2] and e[0] <= now + within]
                if not due and self._running == 0:
                    return True
                if now >= deadline:
                    return False
                self._cv.wait(timeout=min(0.05, deadline - now))

    def stop(self) -> None:
        """Stop the thread after its current job; waiting jobs are dropped (not durable)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)


def _check(request: JobRequest) -> tuple:
    if not request.dedupe_key:
        raise queue.EnqueueError("a job enqueued through the port needs a deterministic name (dedupe_key)")
    return queue.validated(request)


def _pending_in_this_transaction(name: str) -> bool:
    """An enqueue of ``name`` earlier in the open transaction, waiting for its commit."""
    # Entries are (savepoint ids, callback, robust); the stubs still declare Django's old pairs.
    return any(isinstance(entry[1], _AtCommit) and entry[1].job.name == name for entry in connection.run_on_commit)
