"""The worker loop: claim, run, settle — and drain, reap, and report.

``Worker`` owns the ``jobs`` rows it claims; handlers only return an
:class:`~jobs.outcome.Outcome` (or raise). Everything that ends a lease happens here, and
every such write is guarded on the claim's ``lease_token``, so a worker whose lease was
reaped discards its answer (``lost``) instead of stamping it over the new owner's.

Threads: ``concurrency`` loop threads (each with its own database connection), one
listener (``LISTEN vpay_jobs``) that wakes idle loops, and one maintenance thread (the
half-lease reaper and the SQL gauges). The main thread only waits for signals.

Tests call the step methods (:meth:`Worker.run_once`, :meth:`Worker.reap`) directly;
``runworker`` calls :meth:`Worker.run`.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import psycopg
from django.db import DatabaseError, InterfaceError, connection, connections, transaction

from jobs import fence, registry, repository
from jobs.context import JobContext, LeaseLost
from jobs.decisions import Disposition, JobState, Settle, settle_error, settle_outcome
from jobs.kinds import JobKind
from jobs.models import DeadLetterCause
from jobs.outcome import Action, Outcome
from jobs.repository import ClaimedJob
from jobs.schema import PayloadError
from vpay import metrics
from vpay.errors import Category, Classification, PoisonError, Severity, classify, error_chain

logger = logging.getLogger("jobs.worker")

IDLE_SLEEP = 1.0  # an idle loop waits this long for a NOTIFY before claiming again
DEFAULT_BATCH = 100
# A claimed batch is only held while its handlers are fast: once a handler has run this
# long, the batch's unstarted jobs go back to the queue for other workers to take.
HOLD_LIMIT_SECONDS = 1.0
GAUGE_PERIOD = 5.0
CLAIM_BACKOFF_CAP = 10.0
# A group of fenced jobs commits once its bodies have run this long (see _run_group).
GROUP_HOLD_SECONDS = 0.05


class _GroupAbort(Exception):
    """Roll the group back; its jobs are rerun one by one."""


class _Undo(Exception):
    """A fenced body answered something other than DONE: roll back, then settle that answer."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.action.value)
        self.outcome = outcome


class _Duplicate(Exception):
    """The fence row appeared while the body ran: roll back; the job is a duplicate."""


class _LeaseGone(Exception):
    """The job's delete matched nothing: the lease was taken; roll the effect back."""


@dataclass
class Report:
    """What one worker did, by disposition. ``lost`` > 0 means a lease shorter than a handler."""

    claimed: int = 0
    finished: int = 0
    retried: int = 0
    rescheduled: int = 0
    deferred: int = 0
    dead_lettered: int = 0
    lost: int = 0
    released: int = 0
    unsettled: int = 0  # the settle write itself failed; lease recovery takes the job

    def count(self, disposition: Disposition, n: int = 1) -> None:
        setattr(self, disposition.value, getattr(self, disposition.value) + n)

    def merge(self, other: Report) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items())


class Held(enum.Enum):
    """Where a claimed job stands in this worker."""

    UNSTARTED = "unstarted"  # claimed in a batch, not begun: handing it back refunds its attempt
    STARTED = "started"  # its handler is running (or ran and its settle is being written)
    DONE = "done"  # finished; its delete is buffered with its batch's


@dataclass
class _LoopState:
    """Per-thread state. ``held`` is also read by the maintenance thread (to hand back a
    slow batch's unstarted jobs) and by the main thread at grace expiry, under ``lock``."""

    report: Report = field(default_factory=Report)
    held: dict[int, tuple[uuid.UUID, Held]] = field(default_factory=dict)  # id -> (token, state)
    lock: threading.Lock = field(default_factory=threading.Lock)
    tenant_after: str = ""
    claim_failures: int = 0
    current: tuple[ClaimedJob, JobContext] | None = None  # the job whose handler runs now
    warned_timeout: int | None = None

    def hold(self, jobs: list[ClaimedJob]) -> None:
        with self.lock:
            for job in jobs:
                self.held[job.id] = (job.lease_token, Held.UNSTARTED)

    def start(self, job: ClaimedJob) -> bool:
        """Mark ``job`` started; False when it was already handed back (see take)."""
        with self.lock:
            if job.id not in self.held:
                return False
            self.held[job.id] = (job.lease_token, Held.STARTED)
            return True

    def done(self, job: ClaimedJob) -> None:
        with self.lock:
            self.held[job.id] = (job.lease_token, Held.DONE)

    def forget(self, job: ClaimedJob) -> None:
        with self.lock:
            self.held.pop(job.id, None)

    def take(self, *states: Held) -> list[tuple[int, uuid.UUID]]:
        """Remove and return the held leases in ``states``."""
        with self.lock:
            taken = [(job_id, token) for job_id, (token, st) in self.held.items() if st in states]
            for job_id, _ in taken:
                del self.held[job_id]
            return taken


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """A pool of claim/run/settle loops over the queue. See the module docstring."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        queues: Sequence[str] = ("default",),
        lease_seconds: float | None = None,
        grace_seconds: float = 30.0,
        burst: bool = False,
        batch_size: int = DEFAULT_BATCH,
        idle_sleep: float = IDLE_SLEEP,
        max_tenants: int = 64,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if lease_seconds is not None and lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if not queues:
            raise ValueError("at least one queue is needed")
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.queues = list(queues)
        self.lease_seconds = lease_seconds
        self.grace_seconds = grace_seconds
        self.burst = burst
        self.batch_size = batch_size
        self.idle_sleep = idle_sleep
        self.max_tenants = max_tenants
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr

        specs = registry.all_specs()
        self._kind_leases = {s.kind.value: s.lease_seconds for s in specs}
        self._default_lease = max(self._kind_leases.values(), default=60.0)
        shortest = lease_seconds or min(self._kind_leases.values(), default=60.0)
        # Half a lease: the reaper can only free a lease already older than a lease, so a
        # period of a whole lease would put the worst case at two. Floored at the idle
        # sleep so a very short lease does not turn the reaper into a hot loop.
        self.reap_period = max(shortest / 2, idle_sleep)

        self._states: list[_LoopState] = []
        self._states_lock = threading.Lock()
        self._wake = threading.Condition()
        self._wake_generation = 0
        self._stopping = threading.Event()
        self._exit_now = threading.Event()
        self._grace_deadline: float | None = None
        self._threads: list[threading.Thread] = []
        self._metric_children: dict[tuple[str, str], object] = {}
        self.boot_report = Report()
        self.crashed = False  # a loop thread died: the process should exit non-zero

    # --- lifecycle ----------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: stop claiming, drain within grace. Second call: exit now."""
        if self._stopping.is_set():
            self._exit_now.set()
        else:
            # The grace clock starts at the signal, not at boot.
            self._grace_deadline = time.monotonic() + self.grace_seconds
            self._stopping.set()
        self._notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def forced(self) -> bool:
        """A second signal asked for an immediate exit."""
        return self._exit_now.is_set()

    def run(self) -> tuple[Report, bool]:
        """Run until drained (``burst``) or stopped. Returns the report and whether any
        loop thread was abandoned mid-job (the caller must then exit the process)."""
        self.boot()
        for i in range(self.concurrency):
            thread = threading.Thread(target=self._loop, name=f"vpay-loop-{i}", daemon=True)
            self._threads.append(thread)
        helpers = [
            threading.Thread(target=self._listen, name="vpay-listen", daemon=True),
            threading.Thread(target=self._maintain, name="vpay-maintain", daemon=True),
        ]
        for thread in self._threads + helpers:
            thread.start()
        if self.lease_seconds is not None:
            longest = max((s.timeout_seconds for s in registry.all_specs()), default=0.0)
            if self.lease_seconds < longest:
                logger.warning(
                    "--lease is shorter than the longest kind timeout: a handler that runs past "
                    "the lease is run again elsewhere and its own answer is counted lost",
                    extra={"lease": self.lease_seconds, "longest_timeout": longest},
                )
        logger.info(
            "worker started",
            extra={
                "worker_id": self.worker_id,
                "concurrency": self.concurrency,
                "queues": ",".join(self.queues),
                "burst": self.burst,
                "reap_period": self.reap_period,
            },
        )
        abandoned = False
        while alive := [t for t in self._threads if t.is_alive()]:
            if self._exit_now.is_set():
                abandoned = True
                logger.warning("second signal: exiting now; held leases are left to the reaper")
                break
            if self._grace_deadline is not None and time.monotonic() >= self._grace_deadline:
                abandoned = True
                self._release_everything_held()
                break
            alive[0].join(timeout=0.05)
        self._stopping.set()
        self._notify_all()
        report = self.report()
        logger.info("worker stopped", extra={"worker_id": self.worker_id, **report.as_dict()})
        return report, abandoned

    def boot(self) -> None:
        """Reap stale leases, seed the singletons, serve metrics. Failures here are logged;
        only the queue being unreadable would stop a worker, and the loop retries that."""
        try:
            self.reap()
        except DatabaseError:
            logger.exception("boot reap failed; the periodic reaper will retry", extra={"alert": True})
        try:
            from jobs.singletons import seed_singletons

            seed_singletons()
        except DatabaseError:
            # The deployment loses its sweeps, which matters; the jobs it is driving matter more.
            logger.exception("seeding the singleton jobs failed", extra={"alert": True})
        finally:
            connection.close()
        if self.metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(self.metrics_port, addr=self.metrics_addr)

    def report(self) -> Report:
        total = Report()
        total.merge(self.boot_report)
        with self._states_lock:
            for state in self._states:
                total.merge(state.report)
        return total

    # --- the loop -----------------------------------------------------------------------

    def new_state(self) -> _LoopState:
        state = _LoopState()
        with self._states_lock:
            self._states.append(state)
        return state

    def _loop(self) -> None:
        try:
            self._loop_body()
        except BaseException as exc:  # noqa: BLE001 - a dead loop thread must not go unnoticed
            # Handlers' failures are caught per job; reaching here means something escaped
            # (SystemExit raised by a task, a bug in the loop). Stop the whole worker so a
            # supervisor restarts it, rather than run on with fewer loops than configured.
            self.crashed = True
            logger.critical(
                "a worker loop died; stopping the worker", extra={"error": error_chain(exc, 1000), "alert": True}
            )
            self.request_stop()

    def _loop_body(self) -> None:
        state = self.new_state()
        try:
            while not self._stopping.is_set():
                claimed = self.run_once(state)
                if claimed:
                    if claimed >= self.batch_size:
                        self._notify_one()  # more may be waiting: bring in one more loop
                    continue  # a backlog is walked as fast as its jobs run: no sleep
                if self.burst and state.claim_failures == 0:
                    return
                self._wait_for_work(self._claim_backoff(state))
        finally:
            connection.close()

    def run_once(self, state: _LoopState | None = None) -> int:
        """Claim one batch, run it, settle it. Returns how many jobs were claimed."""
        state = state or self.new_state()
        claimed = self._claim(state)
        if not claimed:
            return 0
        finished: list[ClaimedJob] = []
        batch_started = time.monotonic()
        index = 0
        while index < len(claimed):
            held_too_long = index > 0 and time.monotonic() - batch_started > HOLD_LIMIT_SECONDS
            if self._stopping.is_set() or held_too_long:
                self._flush_finished(state, finished)
                self._release_unstarted(state, claimed[index:])
                break
            job = claimed[index]
            if job.id not in state.held:  # handed back while a slow neighbour ran
                index += 1
                continue
            spec = registry.get(job.kind)
            started = time.monotonic()
            if spec is not None and spec.fenced:
                group_end = index + 1
                while group_end < len(claimed) and self._is_fenced(claimed[group_end]):
                    group_end += 1
                group = claimed[index:group_end]
                done = self._run_group(state, spec, group) if len(group) > 1 else 0
                if done == 0:
                    # The group rolled back (or is a single job): run each on its own, where
                    # every failure is classified and settled by itself. Retrying the group
                    # minus its head instead would rerun the same bodies again and again.
                    for single in group:
                        held_too_long = done > 0 and time.monotonic() - batch_started > HOLD_LIMIT_SECONDS
                        if self._stopping.is_set() or held_too_long:
                            break  # the outer loop releases the rest
                        if state.start(single):
                            self._run_fenced(state, spec, single)
                        done += 1
                index += done
            else:
                if state.start(job):
                    settle = self._execute(state, job)
                    if settle is None:  # LeaseLost raised by a heartbeat
                        self._count(state, job, Disposition.LOST)
                        self._forget(state, job)
                    elif settle.disposition is Disposition.FINISHED:
                        state.done(job)
                        finished.append(job)
                    else:
                        self._apply(state, job, settle)
                index += 1
            if time.monotonic() - started > HOLD_LIMIT_SECONDS:
                # A slow handler: do not keep fast neighbours' acks waiting behind it.
                self._flush_finished(state, finished)
        self._flush_finished(state, finished)
        return len(claimed)

    @staticmethod
    def _is_fenced(job: ClaimedJob) -> bool:
        spec = registry.get(job.kind)
        return spec is not None and spec.fenced

    # --- fenced kinds: the loop owns the transaction -----------------------------------------

    def _run_group(self, state: _LoopState, spec: registry.KindSpec, group: list[ClaimedJob]) -> int:
        """Run consecutive fenced jobs in ONE transaction with their fence rows and their deletes.

        The fast path for short fenced jobs: one commit for the group instead of one per job.
        Each body runs under its own savepoint, taken lazily just before its first query (a
        body that touches no table needs none), so a body that fails or answers anything
        but DONE is rolled back alone and settled on its own after the commit; its
        neighbours are not run again. A group closes early once its bodies have run for
        GROUP_HOLD_SECONDS, so a slow body does not hold its neighbours' effects (and their
        row locks) uncommitted.

        Only when the group's closing write finds a fence row already there (a concurrent
        run of the same job_id committed first) or a lease taken does the whole group roll
        back and return ``0``; the caller then reruns its jobs one by one. Both need a lease
        to have expired under a live handler, the case in which at-least-once already means
        running again. Returns how many jobs of ``group`` (a prefix) were handled.
        """
        ran: list[ClaimedJob] = []
        failed: list[tuple[ClaimedJob, Settle]] = []
        started = time.monotonic()
        try:
            with transaction.atomic():
                for job in group:
                    job_spec = registry.get(job.kind)
                    if self._poison_reason(job_spec, job) is not None:
                        break  # the single path dead-letters it
                    if not state.start(job):
                        break  # handed back; the outer loop skips it
                    if not job.processed:  # a job whose fence row exists is a duplicate: skip the body
                        settle = self._run_body_in_savepoint(state, job_spec, job)
                        if settle is not None:
                            failed.append((job, settle))
                        else:
                            ran.append(job)
                    else:
                        ran.append(job)
                    if time.monotonic() - started > GROUP_HOLD_SECONDS:
                        break
                if ran:
                    fresh = [j for j in ran if not j.processed]
                    fenced, finished = repository.fence_and_finish(
                        fences=[(j.job_id, j.kind, self._subject(j)) for j in fresh],
                        leases=[(j.id, j.lease_token) for j in ran],
                        ttl_seconds=fence.ttl_seconds(),
                    )
                    if fenced != len(fresh) or finished != len(ran):
                        raise _GroupAbort  # a concurrent run of one of them, or a lease taken
        except Exception as exc:  # noqa: BLE001 - every failure here means "rerun one by one"
            metrics.GROUP_ABORTS.inc()
            logger.warning(
                "fenced group rolled back; its jobs run again one by one",
                extra={"jobs": len(group), "error": error_chain(exc, 300)},
            )
            if not connection.is_usable():
                connection.close()
            return 0
        elapsed = time.monotonic() - started
        for job in ran:
            self._forget(state, job)
            self._count(state, job, Disposition.FINISHED)
            if job.processed:
                metrics.DUPLICATES_SKIPPED.labels(kind=job.kind).inc()
        for job, settle in failed:
            self._apply(state, job, settle)
        handled = len(ran) + len(failed)
        if handled:
            metrics.JOB_DURATION.labels(kind=spec.kind.value).observe(elapsed / handled)
        return handled

    def _run_body_in_savepoint(self, state: _LoopState, spec: registry.KindSpec, job: ClaimedJob) -> Settle | None:
        """Run one fenced body inside the group's transaction; None when it answered DONE.

        Anything else rolls back to the savepoint taken before the body's first query and
        returns the job's settle, to be written after the group commits.
        """
        savepoint: str | None = None
        taking = False
        callbacks_before = len(connection.run_on_commit)

        def savepoint_before_first_query(execute, sql, params, many, context):
            nonlocal savepoint, taking
            if savepoint is None and not taking:
                taking = True  # connection.savepoint() runs a query through this wrapper too
                savepoint = connection.savepoint()
            return execute(sql, params, many, context)

        def roll_back() -> None:
            if savepoint is not None:
                connection.savepoint_rollback(savepoint)
                # Everything the body did is undone, so the group's transaction is healthy again.
                transaction.set_rollback(False)
            # A raw savepoint is not in Django's on_commit bookkeeping: drop the body's
            # callbacks ourselves, or a rolled-back body's on_commit side effect would fire
            # at the group's commit.
            del connection.run_on_commit[callbacks_before:]

        job_state = JobState(job.attempts, job.max_attempts, job.deferrals, spec.max_deferrals)
        ctx = JobContext(job, spec.timeout_seconds, loop_fenced=True, worker_concurrency=self.concurrency)
        state.current = (job, ctx)
        try:
            with connection.execute_wrapper(savepoint_before_first_query):
                outcome = spec.handler(ctx)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"handler for {job.kind!r} returned {type(outcome).__name__}, not Outcome")
        except LeaseLost:
            roll_back()
            return Settle(Disposition.LOST)
        except Exception as exc:  # noqa: BLE001 - classified below, never fatal to the loop
            roll_back()
            return self._settle_for_exception(spec, job, job_state, exc)
        finally:
            state.current = None
        if outcome.action is not Action.DONE:
            roll_back()  # no effect and no fence row for an unfinished body
            return settle_outcome(outcome, job_state)
        if savepoint is not None:
            connection.savepoint_commit(savepoint)
        return None

    def _settle_for_exception(
        self, spec: registry.KindSpec, job: ClaimedJob, job_state: JobState, exc: Exception
    ) -> Settle:
        """Log a handler's failure once, at its classification, and decide its settle."""
        classification = classify(exc)
        self._log_failure(job, classification, exc)
        if not connection.is_usable():
            connection.close()
        return settle_error(
            classification,
            error_chain(exc, 20_000),
            job_state,
            registry.retry_policy(spec),
            defer_seconds=getattr(exc, "delay_seconds", 30.0),
        )

    def _run_fenced(self, state: _LoopState, spec: registry.KindSpec, job: ClaimedJob) -> None:
        """One fenced job: body, fence row and the job's own delete commit together, or nothing does.

        The body runs first and the fence row is inserted with the delete, after it: the
        claim already told us whether the fence row existed, so a fresh job reaches its
        body without another round trip. If a concurrent run committed the same job_id in
        between, the insert finds its row, this transaction rolls back, and the job is
        finished as the duplicate it is.
        """
        job_spec = registry.get(job.kind)
        poison = self._poison_reason(job_spec, job)
        if poison is not None:
            self._apply(state, job, self._poison(job, poison))
            return
        if job.processed:
            self._finish_duplicate(state, job)
            return
        job_state = JobState(job.attempts, job.max_attempts, job.deferrals, job_spec.max_deferrals)
        ctx = JobContext(job, job_spec.timeout_seconds, loop_fenced=True, worker_concurrency=self.concurrency)
        state.current = (job, ctx)
        try:
            with transaction.atomic():
                outcome = job_spec.handler(ctx)
                if not isinstance(outcome, Outcome):
                    raise TypeError(f"handler for {job.kind!r} returned {type(outcome).__name__}, not Outcome")
                if outcome.action is not Action.DONE:
                    raise _Undo(outcome)  # no fence row for an unfinished body
                fenced, finished = repository.fence_and_finish(
                    fences=[(job.job_id, job.kind, self._subject(job))],
                    leases=[(job.id, job.lease_token)],
                    ttl_seconds=fence.ttl_seconds(),
                )
                if not finished:
                    raise _LeaseGone  # someone else owns the job now: our effect must not commit
                if not fenced:
                    raise _Duplicate  # a concurrent run committed this job_id first
        except _Undo as undo:
            self._apply(state, job, settle_outcome(undo.outcome, job_state))
        except _Duplicate:
            self._finish_duplicate(state, job)
        except (_LeaseGone, LeaseLost):
            self._forget(state, job)
            self._lost(state, job, Disposition.FINISHED)
        except Exception as exc:  # noqa: BLE001 - any handler failure is classified, never fatal to the loop
            self._apply(state, job, self._settle_for_exception(job_spec, job, job_state, exc))
        else:
            self._forget(state, job)
            self._count(state, job, Disposition.FINISHED)
        finally:
            state.current = None
            metrics.JOB_DURATION.labels(kind=job.kind).observe(time.monotonic() - ctx.started_monotonic)

    def _finish_duplicate(self, state: _LoopState, job: ClaimedJob) -> None:
        """The job's effect already committed under its job_id: ack it without running it again."""
        metrics.DUPLICATES_SKIPPED.labels(kind=job.kind).inc()
        logger.info("duplicate job skipped by the fence", extra=self._job_fields(job))
        self._flush_finished(state, [job])

    @staticmethod
    def _poison_reason(spec: registry.KindSpec | None, job: ClaimedJob) -> str | None:
        """Why this claimed job can never run (no handler, payload off its schema), or None."""
        if spec is None:
            return f"no handler is registered for kind {job.kind!r}"
        try:
            spec.schema.validate(job.payload)
        except PayloadError as exc:
            return f"invalid payload: {exc}"
        return None

    @staticmethod
    def _subject(job: ClaimedJob) -> str:
        spec = registry.get(job.kind)
        return spec.subject(job.payload) if spec is not None and spec.subject is not None else ""

    def _claim(self, state: _LoopState) -> list[ClaimedJob]:
        try:
            result = repository.claim(
                worker=self.worker_id,
                queues=self.queues,
                batch=self.batch_size,
                lease_seconds=self.lease_seconds,
                kind_leases=self._kind_leases,
                default_lease=self._default_lease,
                after=state.tenant_after,
                max_tenants=self.max_tenants,
            )
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            # Postgres briefly unreachable is what this retry exists for; exiting would
            # turn a blip into a restart loop.
            state.claim_failures += 1
            metrics.CLAIM_FAILURES.inc()
            logger.warning(
                "claim failed; retrying after backoff",
                extra={"error": error_chain(exc, 500), "consecutive_failures": state.claim_failures},
            )
            connection.close()
            return []
        state.claim_failures = 0
        state.tenant_after = result.next_after
        if result.jobs:
            state.hold(result.jobs)
            state.report.claimed += len(result.jobs)
        return result.jobs

    def _claim_backoff(self, state: _LoopState) -> float:
        if state.claim_failures == 0:
            return self.idle_sleep
        return min(self.idle_sleep * (2 ** min(state.claim_failures - 1, 10)), CLAIM_BACKOFF_CAP)

    def _execute(self, state: _LoopState, job: ClaimedJob) -> Settle | None:
        spec = registry.get(job.kind)
        poison = self._poison_reason(spec, job)
        if poison is not None:
            return self._poison(job, poison)
        job_state = JobState(job.attempts, job.max_attempts, job.deferrals, spec.max_deferrals)
        ctx = JobContext(job, spec.timeout_seconds, worker_concurrency=self.concurrency)
        state.current = (job, ctx)
        try:
            outcome = spec.handler(ctx)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"handler for {job.kind!r} returned {type(outcome).__name__}, not Outcome")
        except LeaseLost:
            logger.warning("lease lost while the handler ran", extra=self._job_fields(job))
            return None
        except Exception as exc:  # noqa: BLE001 - any handler failure is classified, never fatal to the loop
            return self._settle_for_exception(spec, job, job_state, exc)
        finally:
            state.current = None
            metrics.JOB_DURATION.labels(kind=job.kind).observe(time.monotonic() - ctx.started_monotonic)
        return settle_outcome(outcome, job_state)

    def _poison(self, job: ClaimedJob, message: str) -> Settle:
        classification = PoisonError.classification
        self._log_failure(job, classification, PoisonError(message))
        return settle_error(
            classification, message, JobState(job.attempts, job.max_attempts, 0, 0), registry.DEFAULT_RETRY
        )

    def _apply(self, state: _LoopState, job: ClaimedJob, settle: Settle) -> None:
        """Write one settle (not a finish), guarded on the lease token."""
        if settle.disposition is Disposition.LOST:  # a heartbeat found the lease taken
            self._forget(state, job)
            self._lost(state, job, Disposition.FINISHED)
            return
        try:
            if settle.disposition is Disposition.DEAD_LETTERED:
                dead_letter_id = repository.dead_letter(
                    job.id,
                    job.lease_token,
                    cause=settle.cause or DeadLetterCause.PERMANENT,
                    category=settle.error_category,
                    error=settle.error,
                )
                matched = dead_letter_id is not None
            else:
                matched = repository.reschedule(
                    job.id,
                    job.lease_token,
                    delay=settle.delay,
                    attempts=settle.attempts.value,
                    add_deferral=settle.add_deferral,
                    error=settle.error,
                    durable=settle.disposition is Disposition.RETRIED,
                )
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            self._settle_failed(state, job, exc)
            return
        finally:
            self._forget(state, job)
        if not matched:
            self._lost(state, job, settle.disposition)
            return
        self._count(state, job, settle.disposition)
        fields_ = self._job_fields(job)
        if settle.disposition is Disposition.DEAD_LETTERED:
            # The dead letter's alert (its alert=true line and webhook) is a send_alert job
            # written with it (jobs.alerts), sent exactly once. A send_alert job itself
            # raises none: this line is its alert.
            alerting_here = job.kind == JobKind.SEND_ALERT
            logger.error(
                "job dead-lettered",
                extra={
                    **fields_,
                    "alert": alerting_here,
                    "dead_letter_id": dead_letter_id,
                    "cause": str(settle.cause),
                    "error_category": settle.error_category,
                },
            )
            if alerting_here:
                metrics.ALERT_EVENTS.labels(category=settle.error_category or "unknown", severity=Severity.ERROR).inc()
        elif settle.disposition is Disposition.RETRIED:
            logger.warning("job failed; retrying", extra={**fields_, "retry_in": round(settle.delay, 3)})
        elif settle.disposition is Disposition.DEFERRED:
            logger.info(
                "job deferred", extra={**fields_, "retry_in": round(settle.delay, 3), "reason": settle.error[:200]}
            )

    def _flush_finished(self, state: _LoopState, finished: list[ClaimedJob]) -> None:
        if not finished:
            return
        batch = list(finished)
        finished.clear()
        try:
            matched = repository.finish_many([(j.id, j.lease_token) for j in batch])
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            for job in batch:
                self._settle_failed(state, job, exc)
                self._forget(state, job)
            return
        for job in batch:
            self._forget(state, job)
            if job.id in matched:
                self._count(state, job, Disposition.FINISHED)
            else:
                self._lost(state, job, Disposition.FINISHED)

    def _release_unstarted(self, state: _LoopState, jobs: list[ClaimedJob]) -> None:
        """Hand back the batch's jobs that never started (attempt refunded)."""
        with state.lock:
            jobs = [j for j in jobs if j.id in state.held]  # the watchdog may have done it already
        if not jobs:
            return
        try:
            released = repository.release([(j.id, j.lease_token) for j in jobs], refund=True)
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            for job in jobs:
                self._settle_failed(state, job, exc)
            released = 0
        for job in jobs:
            self._forget(state, job)
        state.report.released += released
        if released:
            self._metric(jobs[0].kind, Disposition.RELEASED).inc(released)

    def _release_everything_held(self) -> None:
        """Grace ran out: settle or hand back every lease this process still holds (guarded).

        Finished jobs whose delete was still buffered are deleted; jobs whose handler is
        still running go back with their attempt counted; jobs never started go back with
        it refunded.
        """
        with self._states_lock:
            states = list(self._states)
        done, started, unstarted = [], [], []
        for state in states:
            done += state.take(Held.DONE)
            started += state.take(Held.STARTED)
            unstarted += state.take(Held.UNSTARTED)
        released = finished = 0
        try:
            finished = len(repository.finish_many(done))
            released += repository.release(unstarted, refund=True)
            released += repository.release(
                started, refund=False, error=f"released at shutdown: grace elapsed (worker {self.worker_id})"
            )
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            logger.error(
                "releasing held leases failed; the reaper will free them", extra={"error": error_chain(exc, 500)}
            )
        finally:
            connection.close()
        self.boot_report.released += released
        self.boot_report.finished += finished
        logger.warning(
            "grace elapsed; released held leases",
            extra={"worker_id": self.worker_id, "released": released, "in_flight": len(started), "finished": finished},
        )

    def _settle_failed(self, state: _LoopState, job: ClaimedJob, exc: BaseException) -> None:
        state.report.unsettled += 1
        metrics.SETTLE_FAILURES.inc()
        logger.warning(
            "settle failed; the job is left to lease recovery",
            extra={**self._job_fields(job), "error": error_chain(exc, 500)},
        )
        connection.close()

    def _lost(self, state: _LoopState, job: ClaimedJob, intended: Disposition) -> None:
        self._count(state, job, Disposition.LOST)
        logger.warning(
            "lease lost before settle; answer discarded",
            extra={**self._job_fields(job), "intended": intended.value},
        )

    def _forget(self, state: _LoopState, job: ClaimedJob) -> None:
        state.forget(job)

    def _count(self, state: _LoopState, job: ClaimedJob, disposition: Disposition) -> None:
        state.report.count(disposition)
        self._metric(job.kind, disposition).inc()

    def _metric(self, kind: str, disposition: Disposition):
        key = (kind, disposition.value)
        child = self._metric_children.get(key)
        if child is None:
            child = self._metric_children[key] = metrics.JOBS.labels(kind=kind, disposition=disposition.value)
        return child

    def _log_failure(self, job: ClaimedJob, classification: Classification, exc: BaseException) -> None:
        level = {
            Severity.INFO: logging.INFO,
            Severity.WARNING: logging.WARNING,
            Severity.ERROR: logging.ERROR,
            Severity.PAGE: logging.CRITICAL,
        }[classification.severity]
        extra = {
            **self._job_fields(job),
            "category": classification.category.value,
            "severity": classification.severity.value,
            "error": error_chain(exc, 1000),
        }
        if classification.alert:
            extra["alert"] = True
            metrics.ALERT_EVENTS.labels(category=classification.category, severity=classification.severity).inc()
        metrics.ERROR_EVENTS.labels(category=classification.category, severity=classification.severity).inc()
        logger.log(level, "job handler failed", extra=extra)

    @staticmethod
    def _job_fields(job: ClaimedJob) -> dict:
        return {
            "job_id": str(job.job_id),
            "kind": job.kind,
            "queue": job.queue,
            "attempt": job.attempts,
            "correlation_id": job.correlation_id,
        }

    # --- waking -------------------------------------------------------------------------

    def _notify_all(self) -> None:
        with self._wake:
            self._wake_generation += 1
            self._wake.notify_all()

    def _notify_one(self) -> None:
        """Wake one idle loop. A NOTIFY usually announces one job: waking every loop would
        have them all race to claim it, and the winner would pay for the losers' claims on
        a busy machine. A loop that finds a full batch wakes the next one (see _loop)."""
        with self._wake:
            self._wake_generation += 1
            self._wake.notify(1)

    def _wait_for_work(self, timeout: float) -> None:
        with self._wake:
            generation = self._wake_generation
            self._wake.wait_for(lambda: self._wake_generation != generation or self._stopping.is_set(), timeout)

    def _listen(self) -> None:
        """Wake idle loops on NOTIFY. Any failure falls back to the idle poll, then reconnects."""
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        params["application_name"] = f"vpay-listen:{self.worker_id}"[:63]
        failures = 0
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {repository.NOTIFY_CHANNEL}")
                    failures = 0
                    # A catch-up wake: anything enqueued while we were not listening.
                    self._notify_all()
                    while not self._stopping.is_set():
                        for notify in conn.notifies(timeout=self.idle_sleep):
                            if notify.payload in self.queues or not notify.payload:
                                self._notify_one()
            except Exception as exc:  # noqa: BLE001 - idle polling covers for the listener; keep trying
                failures += 1
                logger.warning(
                    "LISTEN connection failed; idle polling continues", extra={"error": error_chain(exc, 300)}
                )
                self._stopping.wait(min(self.idle_sleep * 2**failures, CLAIM_BACKOFF_CAP))
        connection.close()

    # --- maintenance --------------------------------------------------------------------

    def reap(self) -> tuple[int, int]:
        """Free expired leases (and dead-letter jobs that died on their last attempt)."""
        freed, buried, unalerted = repository.reap_expired_leases_counted()
        if freed or buried:
            metrics.LEASES_REAPED.labels(result="released").inc(freed)
            metrics.LEASES_REAPED.labels(result="dead_lettered").inc(buried)
            # Each new dead letter raised its own alert (jobs.alerts) except send_alert jobs'.
            logger.warning(
                "reaped expired leases",
                extra={"released": freed, "dead_lettered": buried, "alert": bool(unalerted)},
            )
        return freed, buried

    def _maintain(self) -> None:
        next_reap = time.monotonic() + self.reap_period
        next_gauges = time.monotonic()
        while not self._stopping.wait(0.25):
            now = time.monotonic()
            self._watch_timeouts(now)
            try:
                if now >= next_reap:
                    next_reap = now + self.reap_period
                    self.reap()
                if self.metrics_port is not None and now >= next_gauges:
                    next_gauges = now + GAUGE_PERIOD
                    self.refresh_gauges()
            except (DatabaseError, InterfaceError, psycopg.Error) as exc:
                logger.warning("maintenance query failed; will retry", extra={"error": error_chain(exc, 300)})
                connection.close()
            except Exception as exc:  # noqa: BLE001 - the reaper must outlive a bug in a gauge
                logger.error("maintenance step failed", extra={"error": error_chain(exc, 500), "alert": True})
                connection.close()
        connections.close_all()

    def refresh_gauges(self) -> None:
        metrics.OLDEST_CLAIMABLE_AGE.set(repository.oldest_claimable_age())
        metrics.QUEUE_DEPTH.clear()
        for queue, kind, claimable, leased, _total in repository.depth():
            metrics.QUEUE_DEPTH.labels(queue=queue, kind=kind, state="claimable").set(claimable)
            metrics.QUEUE_DEPTH.labels(queue=queue, kind=kind, state="leased").set(leased)

    def _watch_timeouts(self, now: float) -> None:
        """Alert on a handler past its timeout, and hand back the unstarted rest of a batch
        stuck behind a slow handler so their leases do not run out unused."""
        with self._states_lock:
            states = list(self._states)
        for state in states:
            current = state.current
            if current is None:
                continue
            job, ctx = current
            running = now - ctx.started_monotonic  # restarts at each heartbeat
            if running > HOLD_LIMIT_SECONDS:
                unstarted = state.take(Held.UNSTARTED)
                if unstarted:
                    try:
                        state.report.released += repository.release(unstarted, refund=True)
                    except (DatabaseError, InterfaceError, psycopg.Error) as exc:
                        logger.warning("handing back a batch failed", extra={"error": error_chain(exc, 300)})
                        connection.close()
            if running > ctx.timeout_seconds and state.warned_timeout != job.id:
                state.warned_timeout = job.id
                logger.error(
                    "job exceeded its timeout; its lease will expire and another worker may run it",
                    extra={**self._job_fields(job), "timeout": ctx.timeout_seconds, "alert": True},
                )
                metrics.ALERT_EVENTS.labels(category=Category.BUG, severity=Severity.ERROR).inc()
