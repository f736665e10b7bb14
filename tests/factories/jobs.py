"""Jobs and dead letters (``tests/factories/__init__.py`` says how every factory is made).

``JobFactory()`` is a due ``tests.tasks.noop`` task put on the queue by
:func:`jobs.adapters.postgres.enqueue`; every argument of ``enqueue`` is a field
(``JobFactory(kind="poll_charge", payload=..., dedupe_key=..., delay=60)``).

``DeadLetterFactory()`` is a letter pending review, written the way a worker writes one: its
job is enqueued, claimed and retried until its last attempt (``attempts``, 5 of 5 by
default), then dead-lettered by :func:`jobs.storage.repository.dead_letter` with ``cause``,
``error_category`` and ``last_error``. If a job with the letter's ``job_id`` is live (a
replay put it back), that job is the one that fails again. Two things stand in for time:
the retries are due at once (no backoff to wait out), and the job's ``created_at`` is set to
``job_created_at`` (ten minutes ago by default) before it fails. The alert the dead-letter
statement raises is then sent by a real worker's run of its ``send_alert`` job, as it would
have been by the time an operator looks: the queue holds no job the test did not make.
"""

from __future__ import annotations

import uuid

import factory

from jobs.adapters import postgres as queue
from jobs.models import Alert, DeadLetter, Job, db_ago
from jobs.runner.worker import Worker
from jobs.storage import repository
from jobs.storage.leases import ClaimedJob
from tests.queue_support import claim, task_payload

FACTORY_WORKER = "factory-worker"


class JobFactory(factory.Factory):
    class Meta:
        model = Job

    kind = "task"
    payload = factory.LazyFunction(task_payload)
    job_id = None
    dedupe_key = None
    delay = None
    queue = "default"
    priority = 0
    tenant = None
    correlation_id = None
    max_attempts = None

    @classmethod
    def _create(cls, model_class, kind, payload, **options) -> Job:
        job_id = queue.enqueue(kind, payload, **options)
        assert job_id is not None, f"a job named {options['dedupe_key'] or options['job_id']} is already live"
        return Job.objects.get(job_id=job_id)


class DeadLetterFactory(factory.Factory):
    class Meta:
        model = DeadLetter

    job_id = factory.LazyFunction(uuid.uuid4)
    kind = "task"
    queue = "default"
    # A task records "replayed" when a replay runs it; the queue's own kinds (sweep_expired, …) take none.
    payload = factory.LazyAttribute(
        lambda o: task_payload("tests.tasks.record", "replayed") if o.kind == "task" else {}
    )
    priority = 0
    tenant = ""
    correlation_id = factory.LazyFunction(lambda: f"corr-{uuid.uuid4().hex[:8]}")
    dedupe_key = None
    attempts = 5
    max_attempts = 5
    cause = "exhausted"
    error_category = "transient"
    last_error = "TransientError: the rail timed out\nsecond line of the traceback"
    job_created_at = factory.LazyFunction(lambda: db_ago(minutes=10))

    @classmethod
    def _create(cls, model_class, *, attempts, cause, error_category, last_error, job_created_at, **job) -> DeadLetter:
        live = _live_job(job)
        Job.objects.filter(pk=live.pk).update(created_at=job_created_at)
        claimed = _claim_only(live)
        while claimed.attempts < attempts:  # a transient failure's retry, its backoff already over
            assert repository.reschedule(
                claimed.id,
                claimed.lease_token,
                delay=0,
                attempts="keep",
                add_deferral=False,
                error=last_error,
                durable=True,
            )
            claimed = _claim_only(live)
        assert claimed.attempts == attempts, f"the job had run {claimed.attempts} times already"
        letter_id = repository.dead_letter(
            claimed.id, claimed.lease_token, cause=cause, category=error_category, error=last_error
        )
        _send_alert(letter_id)
        return DeadLetter.objects.get(pk=letter_id)


def _live_job(job: dict) -> Job:
    """The live job with this ``job_id``, or the job enqueued now with these fields."""
    live = Job.objects.filter(job_id=job["job_id"]).first()
    if live is not None:
        return live
    return JobFactory(**{**job, "tenant": job["tenant"] or None, "correlation_id": job["correlation_id"] or None})


def _claim_only(job: Job) -> ClaimedJob:
    """``job`` claimed by the worker's own claim statement, stepping over every other job."""
    others = list(Job.objects.exclude(pk=job.pk).values_list("pk", flat=True))
    (claimed,) = claim(FACTORY_WORKER, queues=[job.queue], kinds=[job.kind], skip=others).jobs
    return claimed


def _send_alert(letter_id: int) -> None:
    """Run the ``send_alert`` job the letter raised (a ``send_alert`` letter raises none)."""
    alert = Alert.objects.filter(key=f"dead_letter:{letter_id}").first()
    if alert is not None:
        alert_job = Job.objects.get(dedupe_key=f"alert:{alert.pk}")
        Worker(worker_id=FACTORY_WORKER, queues=[alert_job.queue]).run_claimed(_claim_only(alert_job))
