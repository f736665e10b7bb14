"""The worker: executors that claim only what they start now, a completer, a listener and
a maintenance thread.

Capacity, not batches. An idle executor claims ``concurrency - running`` jobs in one fair
statement (``jobs.storage.leases.CLAIM``), for itself and the other idle executors, keeps the first
and hands the rest over at once (``jobs.runner.dispatch``), so a claimed job always has a thread
starting it, N slow jobs at ``concurrency >= N`` start together, and a fast job never
waits behind a slow one while a slot is free. Oban's producer (``limit - running``),
River's (``MaxWorkers - active``) and Solid Queue's (idle threads) do the same; the
prefetch is zero.

Threads, each with its own database connection:

* ``vpay-exec-N`` (``concurrency`` of them): claim when idle, run one job at a time
  (``jobs.runner.invoke``) and write its settle (``jobs.runner.settling``);
* ``vpay-complete``: acknowledges finishes in batches;
* ``vpay-listen``: ``LISTEN`` (``jobs.runner.listener``), waking idle executors (none behind a
  transaction pooler without ``DATABASE_DIRECT_URL``: executors then only poll);
* ``vpay-beat``: the worker heartbeat (its ``workers`` row, from which other workers judge
  it alive, and the leases it holds), and nothing else;
* ``vpay-maintain``: the reaper, hand-backs, the singletons, gauges, timeouts
  (``jobs.maintenance.thread``).

Any of them dying stops the worker (``crashed``), so a supervisor restarts it rather than
let it run on without, say, its heartbeat. The main thread only waits and drains.

Tests drive the step methods (:meth:`Worker.run_once`, :meth:`Worker.reap`) in-process;
``runworker`` calls :meth:`Worker.run`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from jobs import registry
from jobs.maintenance import liveness
from jobs.maintenance.liveness import WorkerIdentity
from jobs.maintenance.thread import Maintenance, reap
from jobs.primitives import ceilings
from jobs.runner import drain
from jobs.runner.context import JobContext
from jobs.runner.decisions import Disposition
from jobs.runner.dispatch import Dispatcher
from jobs.runner.invoke import Ran, run_job
from jobs.runner.listener import connect_params, listen
from jobs.runner.report import Report
from jobs.runner.settling import DB_ERRORS, Completer, Settler
from jobs.runner.warmup import warm_up
from jobs.storage import leases, parking
from jobs.storage.leases import ClaimedJob
from vpay import faultpoints, metrics
from vpay.db_pooler import WakeSource, wake_source
from vpay.errors import error_chain

logger = logging.getLogger("jobs.runner.worker")

IDLE_SLEEP = 1.0  # an idle dispatcher waits this long for a NOTIFY before claiming again
# The worker heartbeat: every beat extends every held lease to 2 beats (plus a margin), so a
# dead worker's jobs are rescued about two periods after its last beat.
HEARTBEAT_SECONDS = 5.0
LEASE_BEATS = 2.0
LEASE_MARGIN_SECONDS = 2.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(eq=False)
class Running:
    """A job handed to an executor: what the drain and the timeout watch read."""

    job: ClaimedJob
    ctx_holder: list = field(default_factory=list)  # run_job appends the JobContext
    warned: bool = False

    @property
    def ctx(self) -> JobContext | None:
        return self.ctx_holder[0] if self.ctx_holder else None


class Worker:
    """See the module docstring."""

    # Where each option came from (flag, env, default), when runworker recorded it: read by
    # jobs.primitives.ceilings.of_worker for the startup log; a Worker built in code has none.
    option_sources: Mapping[str, str] | None = None

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        queues: Sequence[str] = ("default",),
        grace_seconds: float = 30.0,
        burst: bool = False,
        idle_sleep: float = IDLE_SLEEP,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        max_tenants: int = 64,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if heartbeat_seconds <= 0:
            raise ValueError("heartbeat_seconds must be positive")
        if not queues:
            raise ValueError("at least one queue is needed")
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.queues = list(queues)
        self.grace_seconds = grace_seconds
        self.burst = burst
        self.idle_sleep = idle_sleep
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_seconds = heartbeat_seconds * LEASE_BEATS + LEASE_MARGIN_SECONDS
        self.max_tenants = max_tenants
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        # The reaper runs every beat: a dead worker's leases are found at most a beat late.
        self.reap_period = heartbeat_seconds

        specs = registry.all_specs()
        # Without a heartbeat (the step methods, in tests) a lease must cover the handler:
        # the kind's timeout plus a margin, as the claim writes it.
        self._kind_leases = {s.kind.value: s.lease_seconds for s in specs}
        # What this release can run: the claim takes nothing else (a rolling deploy's newer
        # kinds wait for newer workers, no attempt spent).
        self.kinds = sorted(self._kind_leases)
        # Merchant-paced kinds (webhooks) never hold the last reserved_executors executors.
        self.paced_kinds = sorted(s.kind.value for s in specs if s.merchant_paced)
        self.unpaced_kinds = sorted(set(self.kinds) - set(self.paced_kinds))
        self.reserved_executors = ceilings.reserved_executors(concurrency) if self.paced_kinds else 0
        self._default_lease = max(self._kind_leases.values(), default=60.0)
        self._heartbeating = False

        self._report = Report()
        self.settler = Settler(self._report)
        self._completer = Completer(self.settler)
        self._running: dict[int, Running] = {}
        self._cv = threading.Condition()  # guards _running and _solo (and the dispatcher's wakes)
        self._solo = False  # a suspect is running: nothing else starts beside it
        self.dispatcher = Dispatcher(self)
        self._stopping = threading.Event()
        self._exit_now = threading.Event()
        self._grace_deadline: float | None = None
        self._threads: list[threading.Thread] = []
        self._beat_stop = threading.Event()  # set once nothing is held any more
        self.crashed = False  # a thread died: the process should exit non-zero

    # --- lifecycle ----------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: stop claiming, drain within grace. Second call: exit now."""
        if self._stopping.is_set():
            self._exit_now.set()
        else:
            # The grace clock starts at the signal, not at boot.
            self._grace_deadline = time.monotonic() + self.grace_seconds
            self._stopping.set()
        self._wake()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def forced(self) -> bool:
        """A second signal asked for an immediate exit."""
        return self._exit_now.is_set()

    def report(self) -> Report:
        return self._report

    def identity(self) -> WorkerIdentity:
        return WorkerIdentity(
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            self.concurrency,
            ",".join(self.queues),
            self.heartbeat_seconds,
        )

    def run(self) -> tuple[Report, bool]:
        """Run until drained (``burst``) or stopped. Returns the report and whether any
        executor was abandoned mid-job (the caller must then exit the process)."""
        self._heartbeating = True
        self.boot()
        metrics.WORKER_CONCURRENCY.set(self.concurrency)
        maintenance = Maintenance(self)
        wakes = wake_source(pooler=settings.VPAY_DB_POOLER, direct_url=bool(settings.VPAY_DATABASE_DIRECT))
        named = [
            ("vpay-beat", self._beat),
            ("vpay-complete", self._completer.run),
            ("vpay-maintain", maintenance.run),
            *(() if wakes is WakeSource.POLL else [("vpay-listen", self._listener(wakes))]),
            *((f"vpay-exec-{i}", self._execute) for i in range(self.concurrency)),
        ]
        if wakes is WakeSource.POLL:
            logger.warning(
                "no LISTEN/NOTIFY: DATABASE_URL is a transaction pooler and DATABASE_DIRECT_URL is not set;"
                f" idle executors poll every {self.idle_sleep:g}s",
                extra={"worker_id": self.worker_id, "wakeups": wakes.value},
            )
        for name, target in named:
            thread = threading.Thread(target=self._guarded, args=(name, target), name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        logger.info(
            "worker started",
            extra={
                "worker_id": self.worker_id,
                "concurrency": self.concurrency,
                "queues": ",".join(self.queues),
                "burst": self.burst,
                "heartbeat": self.heartbeat_seconds,
                "lease": self.lease_seconds,
                "prefetch": 0,
                "wakeups": wakes.value,  # listen over DATABASE_DIRECT_URL / DATABASE_URL, or poll
                "ceilings": ceilings.publish(self),  # every ceiling, also set as vpay_ceiling gauges
            },
        )
        abandoned = drain.wait_and_drain(self)
        report = self._report
        logger.info("worker stopped", extra={"worker_id": self.worker_id, **report.as_dict()})
        return report, abandoned

    def _listener(self, source: WakeSource):
        params = connect_params(source, self.worker_id)
        return lambda: listen(
            params=params, queues=self.queues, wake=self._wake_one, stopping=self._stopping, poll=self.idle_sleep
        )

    def _guarded(self, name: str, target) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - a dead thread must not go unnoticed
            # Handlers' failures are caught per job; reaching here means something escaped
            # (SystemExit raised by a task, a bug). Stop the whole worker so a supervisor
            # restarts it, rather than run on without this thread.
            self.crashed = True
            logger.critical(
                "a worker thread died; stopping the worker",
                extra={"thread_name": name, "error": error_chain(exc, 1000), "alert": True},
            )
            self.request_stop()
            if name.startswith("vpay-exec") or name == "vpay-complete":
                self._exit_now.set()  # its job's settle may never come: do not wait out the grace

    def boot(self) -> None:
        """Reap dead workers' leases, unpark what is due, seed the singletons, serve metrics.
        Failures here are logged; only the queue being unreadable would stop a worker, and
        the loop retries that. Then what the apps registered is built (``warmup``)."""
        try:
            self.reap()
        except DB_ERRORS:
            logger.exception("boot reap failed; the periodic reaper will retry", extra={"alert": True})
        try:
            # Before the first claim: a --burst worker started after no worker ran for a while
            # would otherwise find nothing claimable and exit with overdue parked jobs left.
            parking.unpark_due()
        except DB_ERRORS:
            logger.exception("boot unpark failed; the maintenance thread will retry", extra={"alert": True})
        try:
            from jobs.maintenance.singletons import seed_singletons

            seed_singletons()
            if self._heartbeating:
                self.heartbeat()
        except DB_ERRORS:
            # The deployment loses its sweeps, which matters; the jobs it is driving matter
            # more. The maintenance thread seeds them again every minute.
            logger.exception("seeding the singleton jobs failed", extra={"alert": True})
        finally:
            connection.close()
        warm_up()
        if self.metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(self.metrics_port, addr=self.metrics_addr)

    # --- the dispatcher's side of the slots -------------------------------------------------

    def _claim(self, free: int, alone: bool) -> list[ClaimedJob] | None:
        return self.dispatcher.claim(free, alone)

    def _wake(self) -> None:
        self.dispatcher.wake()

    def _wake_one(self) -> None:  # new work (a NOTIFY): one executor claims, and wakes more if it fills
        self.dispatcher.notified()

    def check_suspects(self) -> None:
        self.dispatcher.check_suspects()

    # --- executors --------------------------------------------------------------------------

    def _execute(self) -> None:
        """An executor: run one job at a time, claiming when idle (jobs.runner.dispatch)."""
        try:
            self.dispatcher.executor_ready()
            while (job := self.dispatcher.next_job()) is not None:
                self.run_claimed(job)
        finally:
            connection.close()

    def run_claimed(self, job: ClaimedJob) -> Disposition:
        """Run one claimed job on this thread and settle it; frees its slot."""
        with self._cv:
            running = self._running.get(job.id) or self._running.setdefault(job.id, Running(job))
        try:
            faultpoints.reached("job.claimed", job.kind)
            ran: Ran = run_job(
                job,
                running.ctx_holder,
                concurrency=self.concurrency,
                worker_id=self.worker_id if self._heartbeating else None,
                defer_fence=True,
            )
            faultpoints.reached("job.ran", job.kind)
            disposition = ran.settle.disposition
            if disposition is Disposition.UNRUNNABLE:
                self.dispatcher.note_unrunnable(job.id)
            if disposition is Disposition.FINISHED and ran.committed:
                self.settler.count(job, Disposition.FINISHED)
            elif disposition is Disposition.FINISHED:
                if self._heartbeating:
                    self._completer.add(job, ran.fence_subject)
                else:
                    self.settler.finish([job], None if ran.fence_subject is None else {job.id: ran.fence_subject})
            else:
                self.settler.apply(job, ran.settle)
            return disposition
        finally:
            # No wake here: this executor claims next itself (jobs.runner.dispatch); a wake would
            # stir every idle executor per job, only for each to find nothing new.
            with self._cv:
                self._running.pop(job.id, None)
                if job.suspect:
                    self._solo = False
            metrics.RUNNING_JOBS.set(self.running_count())

    def register(self, jobs: list[ClaimedJob]) -> None:
        """Claimed jobs are running from the claim on (a suspect alone)."""
        with self._cv:
            for job in jobs:
                self._running[job.id] = Running(job)
            if jobs[0].suspect:
                self._solo = True
        self._report.add("claimed", len(jobs))
        metrics.RUNNING_JOBS.set(self.running_count())

    def running_count(self) -> int:
        with self._cv:
            return len(self._running)

    def paced_room(self) -> int:
        """Under ``_cv``: how many more jobs of the merchant-paced kinds may start now."""
        paced = self.paced_kinds
        running = sum(1 for r in self._running.values() if r.job.kind in paced)
        return self.concurrency - self.reserved_executors - running

    def running_snapshot(self) -> list[Running]:
        with self._cv:
            return list(self._running.values())

    def settler_has_pending(self) -> bool:
        return self.settler.has_pending()

    # --- heartbeat -------------------------------------------------------------------------------

    def heartbeat(self) -> int:
        """Beat: the worker's row and every lease it holds, extended (the beat thread)."""
        return liveness.worker_heartbeat(self.identity(), self.lease_seconds)

    def _beat(self) -> None:
        """The beat thread: the worker heartbeat and nothing else, on a connection of its own,
        from boot until nothing is held any more (the drain included). Other workers judge
        this one dead from its row alone (jobs.maintenance.reaper), so nothing that can be slow (a reap,
        a gauge scan, a hand-back waiting on a row) may delay it. A failed beat is retried
        every second, so the first beat after an outage comes as soon as the database does."""
        try:
            while True:
                started = time.monotonic()
                period = self.heartbeat_seconds
                try:
                    self.heartbeat()
                except DB_ERRORS as exc:
                    logger.warning("heartbeat failed; retrying", extra={"error": error_chain(exc, 300)})
                    connection.close()
                    period = min(1.0, self.heartbeat_seconds)
                if self._beat_stop.wait(max(0.0, period - (time.monotonic() - started))):
                    return
        finally:
            connection.close()

    # --- step methods (tests) -----------------------------------------------------------------

    def run_once(self) -> int:
        """Claim one job (a due suspect first), run it on this thread and settle it. Returns
        how many jobs were claimed (0 or 1). Leases are the kinds' own (no heartbeat)."""
        self.dispatcher.suspect_waiting = self.dispatcher.suspect_waiting or leases.suspect_waiting(
            self.queues, self.kinds
        )
        jobs = self._claim(1, alone=True)
        for job in jobs or []:
            self.run_claimed(job)
        return len(jobs or [])

    def reap(self) -> tuple[int, int]:
        """Rescue dead workers' jobs; returns (released, dead-lettered)."""
        return reap(self.worker_id, beating=self._heartbeating)
