"""Settling what ran: the guarded writes that end or move a lease, their counts and logs.

Finishes of kinds that own their transactions are acknowledged by the :class:`Completer`:
an executor hands the job over and is free at once, and the completer deletes whatever
has gathered in one statement. It flushes as soon as it has something, so a finished job
is acknowledged within a round trip, never behind a slow neighbour; under load, what
finishes while one flush is in flight goes in the next. Every other settle (retry,
reschedule, deferral, dead letter) is written by the executor itself, durably where it
is evidence (``jobs.storage.repository.reschedule``, ``dead_letter``).

A settle whose write fails because the database went away is not left to the lease
reaper: the worker still knows the lease token, and :meth:`Settler.hand_back_pending`
gives the lease back (attempt refunded: the outage was not the job's doing) as soon as
the database answers again.
"""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
from django.db import DatabaseError, InterfaceError, connection

from jobs import registry
from jobs.kinds import JobKind
from jobs.models import DeadLetterCause
from jobs.primitives import cancels, fence
from jobs.runner.decisions import Disposition, Settle
from jobs.runner.invoke import job_fields, note_duplicate
from jobs.runner.report import Report
from jobs.storage import leases, repository
from jobs.storage.leases import ClaimedJob
from vpay import metrics
from vpay.errors import Severity, error_chain

logger = logging.getLogger("jobs.runner.worker")

DB_ERRORS = (DatabaseError, InterfaceError, psycopg.Error)


class Settler:
    """Writes settles, counts them (report and metrics) and logs them, from any thread."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self._pending: dict[int, uuid.UUID] = {}  # leases whose settle write failed
        self._pending_lock = threading.Lock()
        self._metric_children: dict[tuple[str, str], object] = {}

    # --- writes -------------------------------------------------------------------------

    def finish(self, jobs: list[ClaimedJob], fences: dict[int, str] | None = None) -> None:
        """Delete finished jobs (one statement), guarded on their tokens. ``fences``: job pk
        -> fence subject of the fenced jobs among them whose handler wrote nothing
        (:attr:`jobs.runner.invoke.Ran.fence_subject`): their fence rows go in the same statement."""
        if not jobs:
            return
        overtaken: list = []
        duplicates: set[int] = set()
        woken: set[int] = set()
        by_id = {j.id: j for j in jobs}
        try:
            matched = repository.finish_many(
                [(j.id, j.lease_token) for j in jobs],
                overtaken,
                fences={pk: (by_id[pk].kind, subject) for pk, subject in (fences or {}).items() if pk in by_id},
                ttl_seconds=fence.ttl_seconds(),
                duplicates=duplicates,
                once=[j.id for j in jobs if registry.is_fenced(j.kind)],
                woken=woken,
            )
        except DB_ERRORS as exc:
            for job in jobs:
                self.failed(job, exc)
            return
        for job_pk, requested_by, reason in overtaken:
            cancels.note_overtaken(by_id[job_pk], requested_by, reason)
        for job_pk in duplicates:
            note_duplicate(by_id[job_pk])
        for job_pk in woken:
            logger.info("job woken while it ran: due again at once", extra=job_fields(by_id[job_pk]))
        for job in jobs:
            if job.id in matched:
                self.count(job, Disposition.FINISHED)
            else:
                self.lost(job, Disposition.FINISHED)

    def apply(self, job: ClaimedJob, settle: Settle) -> None:
        """Write one settle that is not a finish, guarded on the lease token."""
        if settle.disposition is Disposition.LOST:
            self.lost(job, Disposition.FINISHED)
            return
        if settle.disposition is Disposition.RELEASED:  # the database went away under it
            self.failed(job, None)
            self.hand_back_pending()
            return
        try:
            if settle.disposition is Disposition.CANCELLED:  # the handler obeyed a cancel
                matched = cancels.settle_cancelled(job)
            elif settle.disposition is Disposition.DEAD_LETTERED:
                matched = (
                    repository.dead_letter(
                        job.id,
                        job.lease_token,
                        cause=settle.cause or DeadLetterCause.PERMANENT,
                        category=settle.error_category,
                        error=settle.error,
                    )
                    is not None
                )
            else:
                matched = repository.reschedule(
                    job.id,
                    job.lease_token,
                    delay=settle.delay,
                    attempts=settle.attempts.value,
                    add_deferral=settle.add_deferral,
                    error=settle.error,
                    durable=settle.disposition is Disposition.RETRIED,
                    # A wake while it ran (pull_forward) cuts short a wait, never a
                    # failure's backoff or a deferral.
                    wakeable=settle.disposition is Disposition.RESCHEDULED,
                    unrunnable=settle.disposition is Disposition.UNRUNNABLE,
                )
            if not matched and settle.disposition is not Disposition.CANCELLED and cancels.settle_cancelled(job):
                # A cancel request refused the re-queue (jobs.primitives.cancels).
                settle = Settle(Disposition.CANCELLED)
                matched = True
        except DB_ERRORS as exc:
            self.failed(job, exc)
            return
        if not matched:
            self.lost(job, settle.disposition)
            return
        self.count(job, settle.disposition)
        self._log(job, settle)

    def failed(self, job: ClaimedJob, exc: BaseException | None) -> None:
        """The database is away (the settle write failed, or the handler's connection did):
        the lease is handed back as soon as it answers."""
        if exc is not None:
            self.report.add("unsettled")
            metrics.SETTLE_FAILURES.inc()
            logger.warning(
                "settle failed; the lease is handed back once the database answers",
                extra={**job_fields(job), "error": error_chain(exc, 500)},
            )
        with self._pending_lock:
            self._pending[job.id] = job.lease_token
        connection.close()

    def has_pending(self) -> bool:
        with self._pending_lock:
            return bool(self._pending)

    def hand_back_pending(self) -> int:
        """Give back the leases whose settle failed (attempt refunded: the outage was not the
        job's doing), due at once. Raises a database error while it is still away (the
        maintenance thread tries again on its next tick)."""
        with self._pending_lock:
            pending = list(self._pending.items())
        if not pending:
            return 0
        try:
            released = leases.release(pending, refund=True, error="handed back: the database went away under it")
        except DB_ERRORS:
            connection.close()
            return 0
        with self._pending_lock:
            for job_id, _ in pending:
                self._pending.pop(job_id, None)
        self.report.add("released", released)
        logger.info("handed back leases whose settle failed", extra={"leases": len(pending), "released": released})
        return released

    # --- counts and logs ----------------------------------------------------------------

    def count(self, job: ClaimedJob, disposition: Disposition, n: int = 1) -> None:
        self.report.count(disposition, n)
        self.metric(job.kind, disposition).inc(n)

    def lost(self, job: ClaimedJob, intended: Disposition) -> None:
        self.count(job, Disposition.LOST)
        logger.warning(
            "lease lost before settle; answer discarded", extra={**job_fields(job), "intended": intended.value}
        )

    def metric(self, kind: str, disposition: Disposition):
        key = (kind, disposition.value)
        child = self._metric_children.get(key)
        if child is None:
            child = self._metric_children[key] = metrics.JOBS.labels(kind=kind, disposition=disposition.value)
        return child

    def _log(self, job: ClaimedJob, settle: Settle) -> None:
        fields_ = job_fields(job)
        if settle.disposition is Disposition.DEAD_LETTERED:
            # The dead letter's alert (its alert=true line and webhook) is a send_alert job
            # written with it (jobs.operator.alerts), sent exactly once. A send_alert job itself
            # raises none: this line is its alert.
            alerting_here = job.kind == JobKind.SEND_ALERT
            logger.error(
                "job dead-lettered",
                extra={
                    **fields_,
                    "cause": settle.cause.value if settle.cause else "",
                    "error": settle.error[:1000],
                    "alert": alerting_here,
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


class Completer:
    """Acknowledges finished jobs in batches on its own thread (see the module docstring)."""

    def __init__(self, settler: Settler) -> None:
        self.settler = settler
        self._finished: list[ClaimedJob] = []
        self._fences: dict[int, str] = {}  # job pk -> fence subject (Settler.finish)
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False

    def add(self, job: ClaimedJob, fence_subject: str | None = None) -> None:
        with self._cv:
            self._finished.append(job)
            if fence_subject is not None:
                self._fences[job.id] = fence_subject
            self._cv.notify()

    def run(self) -> None:
        """The completer thread: flush whenever something is waiting, until closed and empty."""
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._finished or self._closed)
                    if not self._finished and self._closed:
                        return
                    batch, fences = self._take()
                    self._busy = True
                try:
                    self.settler.finish(batch, fences)
                finally:
                    with self._cv:
                        self._busy = False
                        self._cv.notify_all()
        finally:
            connection.close()

    def close(self) -> None:
        """No more jobs will be added: the thread flushes what is left and ends."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until everything added so far is written; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._finished and not self._busy, timeout)

    def take_unflushed(self) -> tuple[list[ClaimedJob], dict[int, str]]:
        """What was never written (the thread is gone), with its fences: the caller settles it."""
        with self._cv:
            return self._take()

    def _take(self) -> tuple[list[ClaimedJob], dict[int, str]]:
        batch, fences = self._finished, self._fences
        self._finished, self._fences = [], {}
        return batch, fences
