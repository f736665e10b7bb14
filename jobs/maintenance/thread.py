"""The maintenance thread: the reaper, hand-backs, the singletons, unparking jobs coming due,
the planner's statistics of tables that grew, the gauges, and the watch on handlers past
their timeout. (The worker heartbeat has a thread of its own: jobs.runner.worker.)

It runs on a connection of its own, so a worker whose executors are all busy still
rescues other workers' leases. Each step's database failure is logged and the
step retried on the next tick; anything else that escapes is a bug, and the thread's death
stops the worker (jobs.runner.worker) like any other thread's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from jobs.maintenance import liveness, reaper, statistics, unclaimable
from jobs.primitives import cancels
from jobs.runner.invoke import job_fields
from jobs.runner.settling import DB_ERRORS
from jobs.storage import parking
from vpay import metrics
from vpay.errors import error_chain

if TYPE_CHECKING:
    from jobs.runner.worker import Worker

logger = logging.getLogger("jobs.runner.worker")

TICK = 0.25
GAUGE_PERIOD = 5.0


def reap(worker_id: str = "", *, beating: bool = False) -> tuple[int, int]:
    """Rescue dead workers' jobs (``jobs.maintenance.reaper.REAP``), then end those of them (and any run
    handed back) that an operator had asked to cancel; returns (released, dead-lettered).
    A ``beating`` worker's reaper judges nobody until it has beaten on time for a lease."""
    reaped = reaper.reap_expired_leases(worker_id if beating else None)
    cancels.sweep_waiting()
    if reaped.released or reaped.dead_lettered:
        metrics.LEASES_REAPED.labels(result="released").inc(reaped.released)
        metrics.LEASES_REAPED.labels(result="dead_lettered").inc(reaped.dead_lettered)
        # Each new dead letter raised its own alert (jobs.operator.alerts) except send_alert jobs'.
        logger.warning(
            "rescued the jobs of a dead worker",
            extra={
                "reaper": worker_id,
                "released": reaped.released,
                "suspects": reaped.suspects,
                "dead_lettered": reaped.dead_lettered,
                "alert": bool(reaped.unalerted),
            },
        )
    return reaped.released, reaped.dead_lettered


def refresh_gauges() -> None:
    from vpay import sql_gauges  # imports every app's metrics: after the registry is loaded

    sql_gauges.refresh()


class Maintenance:
    """The steps, each due on its own period; :meth:`run` is the thread's body."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        now = time.monotonic()
        self._due = {
            "reap": now + worker.reap_period,
            "singletons": now + worker.reap_period,
            "gauges": now,
            "unpark": now,  # at once: a worker starting after none ran finds overdue parked jobs
            "unclaimable": now + unclaimable.PERIOD,
            "statistics": now,  # at once: a worker starting into a backlog plans on its statistics
        }
        self.unclaimable = unclaimable.UnclaimableWatch(worker.queues, worker.kinds)

    def run(self) -> None:
        from django.db import connections

        try:
            while not self.worker._stopping.wait(TICK):
                self.tick(time.monotonic())
            # Draining: hand back what failed to settle while the executors finish (the beat
            # thread keeps their leases).
            while self.worker.running_count() and not self.worker._exit_now.wait(TICK):
                if self.worker.settler_has_pending():
                    self._step("hand_back", self.worker.settler.hand_back_pending)
        finally:
            connections.close_all()

    def tick(self, now: float) -> None:
        worker = self.worker
        self.watch_timeouts(now)
        if worker.settler_has_pending():
            self._step("hand_back", worker.settler.hand_back_pending)
        if now >= self._due["reap"]:
            self._due["reap"] = now + worker.reap_period

            def reap() -> None:
                worker.reap()
                worker.check_suspects()

            self._step("reap", reap)
            self._step("prune", lambda: liveness.prune_workers(worker.worker_id if worker._heartbeating else None))
        if now >= self._due["singletons"]:
            self._due["singletons"] = now + worker.reap_period
            self._step("singletons", seed_missing_singletons)
        if now >= self._due["unpark"]:
            self._due["unpark"] = now + parking.STAGE_PERIOD
            self._step("unpark", parking.unpark_due)
        if now >= self._due["unclaimable"]:
            self._due["unclaimable"] = now + unclaimable.PERIOD
            self._step("unclaimable", self.unclaimable.check)
        if now >= self._due["statistics"]:
            self._due["statistics"] = now + statistics.PERIOD
            self._step("statistics", statistics.analyze_grown_tables)
        if worker.metrics_port is not None and now >= self._due["gauges"]:
            self._due["gauges"] = now + GAUGE_PERIOD
            self._step("gauges", refresh_gauges)

    def _step(self, name: str, step) -> None:
        from django.db import connection

        try:
            step()
        except DB_ERRORS as exc:
            logger.warning("maintenance query failed; will retry", extra={"step": name, "error": error_chain(exc, 300)})
            connection.close()

    def watch_timeouts(self, now: float) -> None:
        """Alert once for a handler past its timeout. It keeps its lease and its executor
        until it returns (Python cannot stop a thread); its heartbeat refuses from now on,
        and its answer, when it comes, settles the job as usual."""
        for running in self.worker.running_snapshot():
            ctx = running.ctx
            if ctx is None or running.warned:
                continue
            if now - ctx.started_monotonic > ctx.timeout_seconds:
                running.warned = True
                logger.error(
                    "job exceeded its timeout; it keeps its lease and its executor until it returns",
                    extra={**job_fields(running.job), "timeout": ctx.timeout_seconds, "alert": True},
                )


def seed_missing_singletons() -> list[str]:
    """Re-create any singleton whose row is gone (dead-lettered, cancelled, discarded): the
    outbox drain and the sweeps must not wait for a worker restart."""
    from jobs.maintenance.singletons import seed_singletons

    return seed_singletons()
