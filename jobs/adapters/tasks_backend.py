"""vpay's queue as a Django Tasks backend: ``django.tasks`` on Django 6, the ``django-tasks``
backport on Django 5.2 (whichever is installed, through :mod:`jobs.tasks_api`).

Application code writes ``@task`` functions in any importable module and calls
``.enqueue()``; the call inserts one ``task`` job in the caller's transaction. The worker
imports the function by path and runs it *inside one transaction together with the
``processed_jobs`` fence*, so a task's database writes commit exactly once per result id,
with the queue's retries (5 attempts, full-jitter backoff) and dead letters.

What :meth:`VpayTaskBackend.get_result` reports, honestly:

* ``READY`` / ``RUNNING`` while the job row is live (waiting or leased);
* ``SUCCESSFUL`` once it succeeded, for as long as its fence row is kept
  (``VPAY_PROCESSED_JOBS_TTL_SECONDS``, 7 days by default). Successes are not kept as
  rows, so ``args``/``kwargs`` are empty and ``return_value`` is always ``None``;
* ``FAILED`` once it is in ``dead_letters`` and has no fence row (the last error is in
  ``errors``);
* after the fence row expires: :class:`TaskResultDoesNotExist`, as for an unknown id;
  likewise for a result whose task path no longer imports (a ``TaskResult`` needs its task).

``task_enqueued`` is sent once the job row commits with the caller's transaction (at once
outside one), never for an enqueue that rolled back.

``run_after``: Django's API takes only an aware datetime, an instant on the caller's clock.
The backend turns it into a delay on that same clock (``run_after`` minus this host's now,
0 if past) and PostgreSQL adds the delay to its ``now()``: the database clock sets
``run_at``. That keeps the common relative use (``timezone.now() + timedelta(minutes=10)``)
exact on a host whose clock is off, at the cost of an explicit instant ("09:00 UTC"), which
moves by the host's error; :func:`run_after_at` makes such an instant exact on the database
clock instead.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from jobs import registry
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.models import DeadLetter, Job, ProcessedJob
from jobs.primitives.retry import RetryPolicy
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from jobs.tasks_api import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from vpay.errors import PoisonError, UnrunnableHere

TASK_SCHEMA = PayloadSchema(required={"task": "str", "args": "list", "kwargs": "dict"}, optional={"backend": "str"})


def _task_retry_policy() -> RetryPolicy:
    # Read at use time so deployments (and the test suite's subprocess workers) set it by
    # environment: VPAY_TASK_MAX_ATTEMPTS / _RETRY_BASE_SECONDS / _RETRY_CAP_SECONDS.
    return RetryPolicy(
        max_attempts=settings.VPAY_TASK_MAX_ATTEMPTS,
        base_seconds=settings.VPAY_TASK_RETRY_BASE_SECONDS,
        cap_seconds=settings.VPAY_TASK_RETRY_CAP_SECONDS,
    )


class VpayTaskBackend(BaseTaskBackend):
    """Enqueues tasks as ``task`` jobs. ``priority``: higher runs first, as in Django Tasks."""

    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self._valid_tasks: dict[int, Task] = {}

    def validate_task(self, task: Task) -> None:
        # Every enqueue asks; the answer is fixed for a Task object (frozen) on this backend
        # (its queues), so each object is checked once. The dict keeps the object alive, so
        # its id cannot be reused by another while it is a key.
        if self._valid_tasks.get(id(task)) is task:
            return
        super().validate_task(task)
        if len(self._valid_tasks) >= 1024:
            self._valid_tasks.clear()
        self._valid_tasks[id(task)] = task

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        self.validate_task(task)
        payload = {
            "task": task.module_path,
            "args": normalize_json(list(args)) if args else [],
            "kwargs": normalize_json(dict(kwargs)) if kwargs else {},
            "backend": self.alias,
        }
        delay = None
        if task.run_after is not None:
            # Two readings of this host's clock cancel its error; Postgres adds the delay
            # to now() (see the module docstring for what that costs an explicit instant).
            delay = max((task.run_after - timezone.now()).total_seconds(), 0.0)
        job_id = queue.enqueue(
            JobKind.TASK,
            payload,
            delay=delay,
            queue=task.queue_name,
            # Django Tasks: higher priority first; the queue: lower first.
            priority=-task.priority,
        )
        assert job_id is not None  # None only for a dedupe key that is live; a task has none
        result = _result(task, job_id, TaskResultStatus.READY, payload["args"], payload["kwargs"], self.alias)
        # "Enqueued" is true once the job row commits with the caller's transaction (at once
        # outside one), and never if it rolls back. Robust: a receiver's failure after the
        # commit is logged, not raised at a caller whose task is already queued.
        sender = type(self)

        def announce() -> None:  # a named function: Django's robust on_commit logs its __qualname__
            task_enqueued.send(sender, task_result=result)

        transaction.on_commit(announce, robust=True)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.filter(job_id=job_id, kind=JobKind.TASK).first()
        if job is not None:
            status = TaskResultStatus.RUNNING if job.locked_at else TaskResultStatus.READY
            result = _result(
                _task_of(job.payload["task"], result_id),
                job_id,
                status,
                job.payload["args"],
                job.payload["kwargs"],
                self.alias,
            )
            object.__setattr__(result, "enqueued_at", job.created_at)
            object.__setattr__(result, "last_attempted_at", job.locked_at)
            return result
        # A fence row means it succeeded, even if an earlier attempt was dead-lettered
        # and then replayed.
        fence = ProcessedJob.objects.filter(job_id=job_id, kind=JobKind.TASK).first()
        if fence is not None and fence.subject:
            task = _task_of(fence.subject, result_id)
            result = _result(task, job_id, TaskResultStatus.SUCCESSFUL, [], {}, self.alias)
            object.__setattr__(result, "finished_at", fence.processed_at)
            return result
        letter = DeadLetter.objects.filter(job_id=job_id, kind=JobKind.TASK).order_by("-created_at").first()
        if letter is not None:
            result = _result(
                _task_of(letter.payload["task"], result_id),
                job_id,
                TaskResultStatus.FAILED,
                letter.payload["args"],
                letter.payload["kwargs"],
                self.alias,
            )
            result.errors.append(
                TaskError(exception_class_path=f"vpay.dead_letter.{letter.cause}", traceback=letter.last_error)
            )
            object.__setattr__(result, "enqueued_at", letter.job_created_at)
            object.__setattr__(result, "finished_at", letter.created_at)
            return result
        raise TaskResultDoesNotExist(result_id)


def run_after_at(instant: datetime) -> datetime:
    """The ``run_after`` that makes a task due at ``instant`` on the database clock, whatever
    this host's clock says: ``instant`` minus the database's now, added to this host's now
    (which :meth:`VpayTaskBackend.enqueue` subtracts again). ``ValueError`` for a naive one.

    ``task.using(run_after=run_after_at(instant))``: for an instant that must be exact (a
    settlement cut-off); ``timezone.now() + delta`` needs nothing (see the module docstring).
    """
    if timezone.is_naive(instant):
        raise ValueError("run_after_at() needs an aware datetime")
    with connection.cursor() as cursor:
        # The instant's distance from the statement's time: the clock _RUN_AT adds a delay to.
        cursor.execute("SELECT EXTRACT(EPOCH FROM %s::timestamptz - statement_timestamp())::float8", [instant])
        (seconds,) = cursor.fetchone()
    return timezone.now() + timedelta(seconds=seconds)


def _result(task: Task, job_id: uuid.UUID, status: TaskResultStatus, args, kwargs, alias: str) -> TaskResult:
    return TaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=None,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[],
        worker_ids=[],
    )


def _task_of(path: str, result_id: str) -> Task:
    """The task a stored result names, for :meth:`VpayTaskBackend.get_result`: a
    ``TaskResult`` cannot be built without one, so a path that no longer imports (renamed,
    removed, not a ``@task`` any more) is a result this build cannot report. Its job,
    dead letter or fence row is untouched; the ops console still shows it."""
    try:
        return _import_task(path)
    except PoisonError as exc:
        raise TaskResultDoesNotExist(f"{result_id}: {path!r} no longer imports as a task ({exc})") from None


def _import_task(path: str) -> Task:
    # Either may be a newer release's task during a rolling deploy: the runner leaves it for
    # a worker that has it (vpay.errors.UnrunnableHere).
    try:
        task = import_string(path)
    except ImportError as exc:
        raise UnrunnableHere(f"task {path!r} cannot be imported: {exc}") from None
    if not isinstance(task, Task):
        raise UnrunnableHere(f"{path!r} is not a @task function")
    return task


@registry.register(
    JobKind.TASK,
    schema=TASK_SCHEMA,
    timeout_seconds=settings.VPAY_TASK_TIMEOUT_SECONDS,
    retry=_task_retry_policy,
    # The loop runs the function in one transaction with the fence row and the job's delete.
    fenced=True,
    subject=lambda payload: payload["task"],
)
def run_task(ctx: JobContext) -> Outcome:
    """Run one application task (inside the transaction the loop opened for it)."""
    task = _import_task(ctx.payload["task"])
    args, kwargs = ctx.payload["args"], ctx.payload["kwargs"]
    if task.takes_context:
        result = _result(
            task, ctx.job_id, TaskResultStatus.RUNNING, args, kwargs, ctx.payload.get("backend", "default")
        )
        # TaskContext.attempt counts worker_ids; give it one per attempt so far.
        result.worker_ids.extend(["vpay"] * ctx.attempt)
        task.call(TaskContext(task_result=result), *args, **kwargs)
    else:
        task.call(*args, **kwargs)
    return Outcome.done()
