"""Running one claimed job: the one code path from a claimed row to its :class:`Settle`.

Fenced kinds (registry ``fenced=True``) run inside one transaction with their
``processed_jobs`` row and their own delete, so effect, fence and finish commit together or
not at all; a fenced handler that wrote nothing has no effect to hold, and its fence row
goes with its finish to the worker's batched acknowledgement instead (``defer_fence``).
Other kinds run in autocommit and own their transactions; their finish is
acknowledged afterwards (``jobs.runner.settling``). Either way a handler only returns an
:class:`~jobs.runner.outcome.Outcome` or raises; nothing here writes the job's row except the
fenced finish.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from psycopg import pq

from jobs import registry
from jobs.primitives import cancels, fence
from jobs.primitives.schema import PayloadError
from jobs.runner.context import JobContext, LeaseLost
from jobs.runner.current import JobCancelled, bound
from jobs.runner.decisions import (
    AttemptsChange,
    Disposition,
    JobState,
    Settle,
    settle_error,
    settle_outcome,
    settle_unrunnable,
)
from jobs.runner.outcome import Action, Outcome
from jobs.storage import fence_sql
from jobs.storage.leases import ClaimedJob
from jobs.storage.rowless import rowless
from vpay import metrics
from vpay.db_errors import connection_lost
from vpay.db_pooler import fenced_idle_in_tx_ms
from vpay.errors import Classification, PoisonError, Severity, UnrunnableHere, classify, error_chain

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("jobs.runner.worker")


@dataclass(frozen=True, slots=True)
class Ran:
    """How a job's run ended."""

    settle: Settle
    committed: bool = False  # the fenced transaction already deleted the row: nothing left to write
    duplicate: bool = False  # the fence says its effect already happened
    # A fenced job whose handler wrote nothing: its fence row (this subject) goes with its
    # finish in the completer's batch (run_job's ``defer_fence``).
    fence_subject: str | None = None


class _Undo(Exception):
    """A fenced body answered something other than DONE: roll back, then settle that answer."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.action.value)
        self.outcome = outcome


class _Duplicate(Exception):
    """The fence row appeared while the body ran: roll back; the job is a duplicate."""


class _LeaseGone(Exception):
    """The job's delete matched nothing: the lease was taken; roll the effect back."""


def run_job(
    job: ClaimedJob,
    ctx_holder: list,
    *,
    concurrency: int | None,
    worker_id: str | None = None,
    unrunnable_window: float | None = None,
    defer_fence: bool = False,
) -> Ran:
    """Run ``job``'s handler and decide its settle. ``ctx_holder`` receives the
    :class:`JobContext` as soon as it exists (the maintenance thread watches its clock).
    ``unrunnable_window``: how long a job this process cannot run is left for another
    (``VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS`` when None; 0 where no other process could run it).
    ``defer_fence``: the caller acknowledges finishes with their fences in batches
    (:class:`jobs.runner.settling.Completer`), so a fenced handler that wrote nothing need not
    commit a transaction of its own."""
    window = settings.VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS if unrunnable_window is None else unrunnable_window
    spec = registry.get(job.kind)
    poison = poison_reason(spec, job)
    if poison is not None:
        return Ran(_unrunnable(job, poison, window))
    assert spec is not None  # poison_reason() names a kind with no handler
    if spec.fenced and job.processed:
        note_duplicate(job)
        return Ran(Settle(Disposition.FINISHED), duplicate=True)
    job_state = _state(job, spec.max_deferrals)
    ctx = JobContext(
        job, spec.timeout_seconds, loop_fenced=spec.fenced, worker_concurrency=concurrency, worker_id=worker_id
    )
    ctx_holder.append(ctx)
    own = None  # the job's own connection: whose failure is an outage, not the handler's
    try:
        # An executor handed a job another one claimed may not have connected yet; failing
        # to connect now is an outage (database_went_away with no connection: its SQLSTATE).
        connection.ensure_connection()
        own = connection.connection
        if not spec.fenced:
            return Ran(settle_outcome(_call(spec, ctx), job_state))
        with transaction.atomic():
            _allow_idle_for_lease(spec)
            outcome = _call(spec, ctx)
            if outcome.action is not Action.DONE:
                raise _Undo(outcome)  # no effect and no fence row for an unfinished body
            if defer_fence and not rowless(job) and wrote_nothing():
                # Nothing reached the database in this transaction and nothing waits on
                # its commit, so there is no effect for the fence to hold together with the
                # finish: both go in the completer's next batch, one statement for many
                # jobs, instead of a transaction and a WAL flush of this job's own. Lost
                # with that batch (a crash first), the job runs again, as it would had
                # this transaction been lost; its fence row still arrives with its delete.
                return Ran(Settle(Disposition.FINISHED), fence_subject=subject(spec, job))
            fenced, finished, overtaken = fence_sql.fence_and_finish(
                fences=[(job.job_id, job.kind, subject(spec, job))],
                leases=[(job.id, job.lease_token)],
                ttl_seconds=fence.ttl_seconds(),
            )
            if not finished and not rowless(job):  # an in-process job has no row to delete
                raise _LeaseGone  # someone else owns the job now: our effect must not commit
            if not fenced:
                raise _Duplicate  # a concurrent run committed this job_id first
        for _, requested_by, reason in overtaken:
            cancels.note_overtaken(job, requested_by, reason)
        return Ran(Settle(Disposition.FINISHED), committed=True)
    except _Undo as undo:
        return Ran(settle_outcome(undo.outcome, job_state))
    except _Duplicate:
        note_duplicate(job)
        return Ran(Settle(Disposition.FINISHED), duplicate=True)
    except (_LeaseGone, LeaseLost):
        logger.warning("lease lost while the handler ran", extra=job_fields(job))
        return Ran(Settle(Disposition.LOST))
    except UnrunnableHere as exc:  # a task path this release does not have
        return Ran(_unrunnable(job, str(exc), window))
    except JobCancelled as cancelled:
        if cancelled.job_id == job.job_id:  # its heartbeat saw the request (a fenced body rolled back)
            logger.info("handler stopped for a cancel", extra=job_fields(job))
            return Ran(Settle(Disposition.CANCELLED))
        return Ran(settle_for_exception(spec, job, job_state, cancelled))
    except Exception as exc:  # noqa: BLE001 - any handler failure is classified, never fatal to the worker
        if database_went_away(exc, own):
            # Not the job's failure: the connection under it is gone. Hand it back at once,
            # attempt refunded (jobs.runner.settling keeps the lease if the database is still away).
            logger.warning(
                "the database went away under the handler; handing the job back",
                extra={**job_fields(job), "error": error_chain(exc, 300)},
            )
            connection.close()
            return Ran(Settle(Disposition.RELEASED, attempts=AttemptsChange.REFUND, error=error_chain(exc, 500)))
        return Ran(settle_for_exception(spec, job, job_state, exc))
    finally:
        _duration(job.kind).observe(time.monotonic() - ctx.started_monotonic)


# Each kind's duration histogram, looked up once (labels() takes a lock and builds a key per call).
_DURATIONS: dict[str, Any] = {}


def _duration(kind: str) -> Any:
    child = _DURATIONS.get(kind)
    if child is None:
        child = _DURATIONS[kind] = metrics.JOB_DURATION.labels(kind=kind)
    return child


# The fenced transaction stays open for as long as its handler runs (up to the kind's
# lease). Directly on the server, runworker gave every session that allowance at startup;
# behind a transaction pooler there is no session to give it to, so this transaction takes
# it for itself (set_config(..., true) is SET LOCAL: it ends with the transaction). No index.
_ALLOW_IDLE_IN_TX = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"


def _allow_idle_for_lease(spec: registry.KindSpec) -> None:
    if settings.VPAY_DB_POOLER != "transaction":
        return
    ms = fenced_idle_in_tx_ms(kind_lease_seconds=spec.lease_seconds, default_ms=settings.DB_IDLE_IN_TX_TIMEOUT_MS)
    with connection.cursor() as cursor:
        cursor.execute(_ALLOW_IDLE_IN_TX, [f"{ms}ms"])


def _unrunnable(job: ClaimedJob, reason: str, window: float) -> Settle:
    """This worker cannot run the job: left for one that can, or poison past the window
    (:func:`jobs.runner.decisions.settle_unrunnable`); logged at what it ends as."""
    settle = settle_unrunnable(reason, job.unrunnable_for, window)
    if settle.disposition is Disposition.DEAD_LETTERED:
        log_failure(job, PoisonError.classification, PoisonError(settle.error))
    else:
        logger.warning(
            "this worker cannot run the job; handed back for a worker that can",
            extra={**job_fields(job), "reason": reason[:300]},
        )
    return settle


def database_went_away(exc: BaseException, own: psycopg.Connection | None) -> bool:
    """Whether the job's own connection failed under the handler: a database error, and the
    connection this thread held when the handler started (``own``: the one the claim and the
    settle use) closed or broken since (Django may already have replaced it after a failed
    rollback). A connection error from any other connection (a second database the task
    uses, a client of its own) is the handler's ordinary failure, retried on its backoff with
    the attempt spent: refunding it would loop forever at zero attempts while that database
    is down. Without a connection at the start, the error's SQLSTATE decides
    (:func:`connection_lost`)."""
    if own is None:
        raw = connection.connection
        return connection_lost(exc, closed=raw is not None and (raw.closed or raw.broken))
    # The job's connection is gone, and the error is one of losing a connection (a handler
    # that closed its own connection and then hit a statement timeout on a new one is not).
    return (own.closed or own.broken) and connection_lost(exc, closed=False)


def wrote_nothing() -> bool:
    """Inside the fenced ``atomic()``: no statement has reached the server (psycopg sends
    ``BEGIN`` with the first one) and no ``on_commit`` callback waits for the commit."""
    raw = connection.connection
    return (
        raw is not None and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE and not connection.run_on_commit
    )


def _call(spec: registry.KindSpec, ctx: JobContext) -> Outcome:
    with bound(ctx):  # current_job() on this thread, for code the handler calls
        outcome = spec.handler(ctx)
    if not isinstance(outcome, Outcome):
        raise TypeError(f"handler for {spec.kind.value!r} returned {type(outcome).__name__}, not Outcome")
    return outcome


def _state(job: ClaimedJob, max_deferrals: int) -> JobState:
    return JobState(job.attempts, job.max_attempts, job.deferrals, max_deferrals)


def settle_for_exception(spec: registry.KindSpec, job: ClaimedJob, job_state: JobState, exc: Exception) -> Settle:
    """Log a handler's failure once, at its classification, and decide its settle."""
    classification = classify(exc)
    log_failure(job, classification, exc)
    if not connection.is_usable():
        connection.close()
    return settle_error(
        classification,
        error_chain(exc, 20_000),
        job_state,
        registry.retry_policy(spec),
        defer_seconds=getattr(exc, "delay_seconds", 30.0),
    )


def poison_reason(spec: registry.KindSpec | None, job: ClaimedJob) -> str | None:
    """Why this claimed job can never run (no handler, payload off its schema), or None."""
    if spec is None:
        return f"no handler is registered for kind {job.kind!r}"
    try:
        spec.schema.validate(job.payload)
    except PayloadError as exc:
        return f"invalid payload: {exc}"
    return None


def subject(spec: registry.KindSpec, job: ClaimedJob) -> str:
    return spec.subject(job.payload) if spec.subject is not None else ""


_LEVELS = {
    Severity.INFO: logging.INFO,
    Severity.WARNING: logging.WARNING,
    Severity.ERROR: logging.ERROR,
    Severity.PAGE: logging.CRITICAL,
}


def log_failure(job: ClaimedJob, classification: Classification, exc: BaseException) -> None:
    extra = {
        **job_fields(job),
        "category": classification.category.value,
        "severity": classification.severity.value,
        "error": error_chain(exc, 1000),
    }
    if classification.alert:
        extra["alert"] = True
        metrics.ALERT_EVENTS.labels(category=classification.category, severity=classification.severity).inc()
    metrics.ERROR_EVENTS.labels(category=classification.category, severity=classification.severity).inc()
    logger.log(_LEVELS[classification.severity], "job handler failed", extra=extra)


def note_duplicate(job: ClaimedJob) -> None:
    """The fence says this job's effect already happened: counted and logged once, wherever
    the fence found it (at the claim, in its transaction, or in the completer's batch)."""
    metrics.DUPLICATES_SKIPPED.labels(kind=job.kind).inc()
    logger.info("duplicate job skipped by the fence", extra=job_fields(job))


def job_fields(job: ClaimedJob) -> dict:
    return {
        "job_id": str(job.job_id),
        "kind": job.kind,
        "queue": job.queue,
        "attempt": job.attempts,
        "correlation_id": job.correlation_id,
    }
