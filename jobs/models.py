"""The queue's three tables: live jobs, the idempotency fence, and dead letters.

Successes are metrics, not rows: a finished job's row is deleted, and nothing but its
``processed_jobs`` fence row (when its handler fences) outlives it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce, Length, Now

from jobs.kinds import JobKind
from vpay.errors import Severity

LAST_ERROR_MAX = 2000


class TransactionNow(models.Func):
    """``CURRENT_TIMESTAMP``: the transaction's start, the same instant as ``now()`` in the
    queue's SQL. Django's ``Now()`` is ``STATEMENT_TIMESTAMP()``, which inside a transaction
    is later than ``now()``: a row defaulted with it would not be due to a claim's
    ``run_at <= now()`` in that same transaction."""

    template = "CURRENT_TIMESTAMP"
    output_field = models.DateTimeField()


def db_ago(**delta) -> models.ExpressionWrapper:
    """``now() - timedelta(**delta)`` as an expression PostgreSQL evaluates: ages and windows
    are drawn on the database clock, never the web host's."""
    return models.ExpressionWrapper(
        TransactionNow() - models.Value(timedelta(**delta), output_field=models.DurationField()),
        output_field=models.DateTimeField(),
    )


# The lookup a CHECK constraint below is written with.
models.TextField.register_lookup(Length, "length")


class JobQuerySet(models.QuerySet):
    def claimable(self):
        """Rows a worker may claim now (the shape of the claim query's filter)."""
        return self.filter(locked_at__isnull=True, run_at__lte=Now())

    def leased(self):
        return self.filter(locked_at__isnull=False)


class Job(models.Model):
    """One unit of live work. The worker loop is the only writer after enqueue."""

    job_id = models.UUIDField(
        default=uuid.uuid4, db_default=RandomUUID(), help_text="Stable identity; replay reuses it."
    )
    kind = models.CharField(max_length=64, choices=JobKind.choices)
    queue = models.CharField(max_length=64, db_default="default")
    payload = models.JSONField(default=dict)
    # Lower runs first (ORDER BY priority, run_at).
    priority = models.SmallIntegerField(db_default=0)
    run_at = models.DateTimeField(db_default=TransactionNow())
    attempts = models.IntegerField(db_default=0, help_text="Counted up by the claim itself.")
    max_attempts = models.IntegerField(db_default=5)
    deferrals = models.IntegerField(db_default=0, help_text="Deferrals spend no attempt.")
    # Crashes of a worker that held this job among others, whose attempt was refunded
    # because the crash cannot be pinned on it. Non-zero makes the job a suspect: it runs
    # alone in its worker until it settles (jobs/storage/leases.py, "crash attribution").
    crashes = models.IntegerField(db_default=0)
    dedupe_key = models.TextField(null=True, blank=True)
    correlation_id = models.CharField(max_length=128, db_default="", blank=True)
    tenant = models.CharField(max_length=128, db_default="", blank=True)
    locked_by = models.CharField(max_length=128, null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    locked_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(db_default="", blank=True)
    created_at = models.DateTimeField(db_default=TransactionNow())
    # An operator's cancel of a running job (jobs.services.cancels): who, why and when (the
    # database clock). The handler sees it at its next heartbeat (JobCancelled); the job's
    # next settle ends it cancelled unless the handler finished first (docs/runner.md).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=150, db_default="", blank=True)
    cancel_reason = models.TextField(db_default="", blank=True)
    # Where an iterating handler got to (JobContext.checkpoint), written with its lease's
    # heartbeat; the next run, after a crash, a retry or a reschedule, starts from it. NULL
    # on a fresh pass. `recoveries` counts the reaper's rescues since it last moved: past
    # VPAY_JOB_RECOVERY_CAP the reaper dead-letters the job as no_progress (jobs.maintenance.reaper).
    checkpoint = models.JSONField(null=True, blank=True)
    recoveries = models.IntegerField(db_default=0)
    # Since when the workers that claimed it could not run it (a task path or a payload shape
    # of a newer release, during a rolling deploy): handed back with its attempt refunded for
    # a worker that can; past VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS it is poison. NULL once
    # any run settles it (jobs.runner.decisions.settle_unrunnable).
    unrunnable_since = models.DateTimeField(null=True, blank=True)
    # Due further out than jobs.storage.parking.HORIZON_SECONDS when its run_at was last
    # written (a BEFORE trigger sets it on every write of run_at, migration 0014): kept out of
    # the claim's index, so a million delayed jobs cost the claim nothing; the maintenance
    # thread clears it a horizon before the job is due (jobs.storage.parking).
    parked = models.BooleanField(db_default=False, editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "jobs"
        permissions = [("cancel_job", "Can cancel jobs")]
        constraints = [
            models.UniqueConstraint(fields=["job_id"], name="jobs_job_job_id_unique"),
            # Every row in this table is live, so this is "unique while live": a finished
            # job frees its key for the next enqueue. Partial: keyless jobs (most of them)
            # cost it nothing.
            models.UniqueConstraint(
                fields=["dedupe_key"], condition=Q(dedupe_key__isnull=False), name="jobs_job_dedupe_key_unique"
            ),
            models.CheckConstraint(condition=Q(kind__in=JobKind.values), name="jobs_job_kind_known"),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="jobs_job_attempts_non_negative"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="jobs_job_max_attempts_positive"),
            models.CheckConstraint(condition=Q(deferrals__gte=0), name="jobs_job_deferrals_non_negative"),
            # A lease is all four columns or none of them.
            models.CheckConstraint(
                condition=(
                    Q(
                        locked_at__isnull=True,
                        locked_by__isnull=True,
                        lease_token__isnull=True,
                        lease_expires_at__isnull=True,
                    )
                    | Q(
                        locked_at__isnull=False,
                        locked_by__isnull=False,
                        lease_token__isnull=False,
                        lease_expires_at__isnull=False,
                    )
                ),
                name="jobs_job_lease_complete",
            ),
            models.CheckConstraint(
                condition=Q(last_error__length__lte=LAST_ERROR_MAX), name="jobs_job_last_error_bounded"
            ),
            # A cancel request always says who asked and why.
            models.CheckConstraint(
                condition=Q(cancel_requested_at__isnull=True)
                | (~Q(cancel_requested_by="") & Q(cancel_reason__regex=r"\S")),
                name="jobs_job_cancel_request_recorded",
            ),
        ]
        indexes = [
            # Used by jobs.storage.leases.CLAIM: the tenant skip-scan and each tenant's
            # ORDER BY priority, run_at; partial so leased rows and parked ones (due beyond
            # the parking horizon) cost the claim nothing.
            models.Index(
                fields=["tenant", "priority", "run_at"],
                condition=Q(locked_at__isnull=True, parked=False),
                name="jobs_job_ready_idx",
            ),
            # Used by jobs.storage.parking._UNPARK: parked jobs by due time.
            models.Index(fields=["run_at"], condition=Q(parked=True), name="jobs_job_parked_idx"),
            # Used by jobs.maintenance.reaper.REAP: leases past their expiry.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(locked_at__isnull=False),
                name="jobs_job_lease_expiry_idx",
            ),
            # Used by jobs.storage.leases: a worker's heartbeat extends its leases, and the reaper
            # rescues all of a dead worker's jobs at once.
            models.Index(fields=["locked_by"], condition=Q(locked_at__isnull=False), name="jobs_job_locked_by_idx"),
            # Used by jobs.storage.leases.SUSPECT_WAITING: is a suspect waiting to run alone.
            models.Index(
                fields=["run_at"], condition=Q(locked_at__isnull=True, crashes__gt=0), name="jobs_job_suspect_idx"
            ),
            # Used by jobs.primitives.cancels.SWEEP: waiting jobs that carry a cancel request (a handed-back
            # or rescued run). Almost always empty, so probing it every beat costs nothing.
            models.Index(
                fields=["id"],
                condition=Q(locked_at__isnull=True, cancel_requested_at__isnull=False),
                name="jobs_job_cancel_waiting_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.job_id}"


class ProcessedJob(models.Model):
    """The idempotency fence: a row per ``job_id`` whose effect has committed."""

    job_id = models.UUIDField(primary_key=True)
    kind = models.CharField(max_length=64)
    # What the job acted on, for operators and for the Tasks backend's get_result
    # (the task's import path): the job's own row is gone once it succeeded.
    subject = models.CharField(max_length=255, blank=True, db_default="")
    processed_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "processed_jobs"
        indexes = [models.Index(fields=["expires_at"], name="jobs_processed_expires_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.job_id}"


class DeadLetterState(models.TextChoices):
    """Where a dead letter stands in review."""

    PENDING_REVIEW = "pending_review", "Pending review"
    """Waiting for an operator."""
    REPLAYED = "replayed", "Replayed"
    """Re-enqueued with the same job_id."""
    DISCARDED = "discarded", "Discarded"
    """Closed by an operator, with a reason."""


class WorkerProcess(models.Model):
    """A running ``runworker`` process, heartbeating on the database clock.

    A worker is dead when this row's heartbeat is older than its own lease (jobs.maintenance.reaper):
    death is read from the worker's own beat, never from a job's lapsed lease. The beat
    also extends the leases of every job the worker holds (for holders without a row).
    """

    id = models.CharField(primary_key=True, max_length=128, help_text="The worker id, as in jobs.locked_by.")
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    concurrency = models.IntegerField()
    queues = models.TextField()
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())
    # The worker's own beat period and lease, so that every judgement about it (dead, pruned)
    # uses its settings, not the judge's (workers may run with different --heartbeat).
    heartbeat_seconds = models.FloatField(db_default=5.0)
    lease_seconds = models.FloatField(db_default=12.0)
    # Since when its beats have come on time: a beat later than its period plus a margin
    # (an outage, a stall, a fresh start) resets it. Its reaper judges nobody until it has
    # beaten on time for a whole lease, so that the others had time to beat too.
    alive_since = models.DateTimeField(db_default=Now())
    # Until when this worker is the one that stops claiming so that a suspect can run alone
    # on it (jobs.runner.dispatch): one worker at a time drains for suspects, not the whole fleet.
    drains_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "workers"
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.id


class DeadLetterCause(models.TextChoices):
    """Why the job left the queue for a human."""

    EXHAUSTED = "exhausted", "Retries exhausted"
    POISON = "poison", "Poison (invalid payload or unknown kind)"
    PERMANENT = "permanent", "Permanent failure"
    CONFIGURATION = "configuration", "Configuration error"
    DEFERRAL_CEILING = "deferral_ceiling", "Deferred too many times"
    LEASE_EXHAUSTED = "lease_exhausted", "Worker died on the last attempt"
    CRASHED_WORKER = "crashed_worker", "Its worker died running only this job, on its last attempt"
    CANCELLED = "cancelled", "Cancelled by an operator"
    NO_PROGRESS = "no_progress", "Rescued past the recovery cap without its checkpoint moving"


class DeadLetterQuerySet(models.QuerySet):
    def pending_review(self):
        return self.filter(state=DeadLetterState.PENDING_REVIEW)


class DeadLetter(models.Model):
    """Failed work, kept with everything needed to understand and replay it."""

    job_id = models.UUIDField(db_index=True)
    kind = models.CharField(max_length=64)
    queue = models.CharField(max_length=64)
    payload = models.JSONField()
    priority = models.SmallIntegerField(db_default=0)
    tenant = models.CharField(max_length=128, blank=True, db_default="")
    correlation_id = models.CharField(max_length=128, blank=True, db_default="", db_index=True)
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    cause = models.CharField(max_length=32, choices=DeadLetterCause.choices)
    error_category = models.CharField(max_length=32, blank=True, db_default="")
    last_error = models.TextField(blank=True, db_default="")
    job_created_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())
    state = models.CharField(max_length=32, choices=DeadLetterState.choices, db_default=DeadLetterState.PENDING_REVIEW)
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=150, blank=True, db_default="")
    discarded_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.CharField(max_length=150, blank=True, db_default="")
    discard_reason = models.TextField(null=True, blank=True)
    # The job's dedupe key, restored on replay: a replayed singleton must not become a second one.
    dedupe_key = models.TextField(null=True, blank=True)
    # Replayed although past the fence horizon, by someone allowed to (see jobs.services.dead_letters).
    replay_forced = models.BooleanField(db_default=False)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        db_table = "dead_letters"
        permissions = [
            ("replay_deadletter", "Can replay dead letters"),
            ("discard_deadletter", "Can discard dead letters"),
            ("force_replay_deadletter", "Can replay dead letters past the fence horizon"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=DeadLetterState.values), name="jobs_deadletter_state_known"),
            models.CheckConstraint(condition=Q(cause__in=DeadLetterCause.values), name="jobs_deadletter_cause_known"),
            # The final guard behind the admin's form: no discard without a reason with at
            # least one non-blank character. NULL ~ '\S' is NULL, which a CHECK would let
            # through, hence the explicit NULL test.
            models.CheckConstraint(
                condition=~Q(state=DeadLetterState.DISCARDED)
                | (Q(discard_reason__isnull=False) & Q(discard_reason__regex=r"\S")),
                name="jobs_deadletter_discard_requires_reason",
            ),
            # History is part of the state: who and when travel with every transition.
            models.CheckConstraint(
                condition=~Q(state=DeadLetterState.REPLAYED) | (Q(replayed_at__isnull=False) & ~Q(replayed_by="")),
                name="jobs_deadletter_replay_recorded",
            ),
            models.CheckConstraint(
                condition=~Q(state=DeadLetterState.DISCARDED) | (Q(discarded_at__isnull=False) & ~Q(discarded_by="")),
                name="jobs_deadletter_discard_recorded",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "created_at"], name="jobs_deadletter_review_idx"),
            # A bulk replay's keyset pages (jobs.operator.bulk_replay): pending letters in id order.
            models.Index(
                fields=["id"], name="jobs_deadletter_pending_id", condition=Q(state=DeadLetterState.PENDING_REVIEW)
            ),
            # Retention's keyset pages (jobs.maintenance.retention): settled letters by when they were settled.
            models.Index(
                Coalesce("replayed_at", "discarded_at"),
                "id",
                name="jobs_deadletter_settled",
                condition=~Q(state=DeadLetterState.PENDING_REVIEW),
            ),
        ]

    def __str__(self) -> str:
        return f"dead letter {self.pk} ({self.kind} {self.job_id})"


class Alert(models.Model):
    """Something a human must look at, raised once per ``key`` (``jobs.operator.alerts.raise_alert``).

    Kept as a row so that "alerted exactly once" survives retries, racing workers and a
    failing alert endpoint: the ``send_alert`` job logs the line and POSTs the webhook, and
    records each on this row with a compare-and-swap, so neither happens twice.
    """

    key = models.CharField(max_length=200, unique=True, help_text="One alert per key, ever.")
    title = models.CharField(max_length=300)
    severity = models.CharField(max_length=16)
    source = models.CharField(max_length=64, help_text="Who raised it, e.g. jobs.dead_letter.")
    details = models.JSONField(default=dict)
    link = models.CharField(max_length=500, blank=True, db_default="", help_text="An admin path or an absolute URL.")
    created_at = models.DateTimeField(db_default=TransactionNow())
    logged_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    send_attempts = models.IntegerField(db_default=0)
    last_error = models.TextField(blank=True, db_default="")

    class Meta:
        db_table = "alerts"
        # Retention's keyset pages (jobs.maintenance.retention): oldest first.
        indexes = [models.Index(fields=["created_at", "id"], name="jobs_alert_created")]
        constraints = [
            models.CheckConstraint(
                condition=Q(severity__in=[s.value for s in Severity]), name="jobs_alert_severity_known"
            ),
            models.CheckConstraint(
                condition=Q(last_error__length__lte=LAST_ERROR_MAX), name="jobs_alert_last_error_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"alert {self.pk} ({self.key})"


class SweepStepStreak(models.Model):
    """A ``sweep_expired`` step's current run of failed passes (``jobs.maintenance.sweep_health``): one
    row while the step keeps failing, deleted by its next good pass. In the database so the
    count survives the worker restarting between hourly passes."""

    step = models.CharField(max_length=100, primary_key=True)
    failures = models.IntegerField(help_text="Consecutive failed passes.")
    since = models.DateTimeField(db_default=TransactionNow(), help_text="The streak's first failure.")
    last_error = models.TextField(blank=True, db_default="")

    class Meta:
        db_table = "sweep_step_streaks"
        constraints = [
            models.CheckConstraint(condition=Q(failures__gte=1), name="jobs_sweep_streak_failures_positive"),
            models.CheckConstraint(
                condition=Q(last_error__length__lte=LAST_ERROR_MAX), name="jobs_sweep_streak_last_error_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"sweep step {self.step}: {self.failures} failed passes"


class BreakerState(models.TextChoices):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


BREAKER_ERROR_MAX = 500


class Breaker(models.Model):
    """One vendor's circuit breaker (``rail:<code>``, ``webhook_host:<merchant>:<host>:<port>``), shared by
    every worker and the web process (``jobs.primitives.breakers``).

    A row is created by its vendor's first failure: no row means closed. Every write is a
    compare-and-swap on ``version`` (``jobs.primitives.breaker_repository``); every instant is the
    database's.
    """

    name = models.CharField(primary_key=True, max_length=300)
    state = models.CharField(max_length=16, choices=BreakerState.choices, db_default=BreakerState.CLOSED)
    failures = models.IntegerField(db_default=0, help_text="Consecutive transient failures.")
    version = models.BigIntegerField(db_default=0, help_text="Bumped by every write (the compare-and-swap guard).")
    opened_at = models.DateTimeField(null=True, blank=True)
    probe_token = models.UUIDField(null=True, blank=True, help_text="The half-open probe in flight, if any.")
    probe_started_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, db_default="", help_text="The last failure, redacted and bounded.")
    updated_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "breakers"
        constraints = [
            models.CheckConstraint(condition=Q(state__in=BreakerState.values), name="jobs_breaker_state_known"),
            models.CheckConstraint(condition=Q(failures__gte=0), name="jobs_breaker_failures_non_negative"),
            # An open or half-open breaker knows since when; a probe is only ever half-open's.
            models.CheckConstraint(
                condition=Q(state=BreakerState.CLOSED) | Q(opened_at__isnull=False),
                name="jobs_breaker_open_has_opened_at",
            ),
            models.CheckConstraint(
                condition=Q(state=BreakerState.HALF_OPEN) | Q(probe_token__isnull=True),
                name="jobs_breaker_probe_only_half_open",
            ),
            models.CheckConstraint(
                condition=Q(last_error__length__lte=BREAKER_ERROR_MAX), name="jobs_breaker_last_error_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"breaker {self.name} ({self.state})"


# Bulk operations live in their own module (one job each); importing them here registers them.
from jobs.bulk_models import BulkItem, BulkOperation  # noqa: E402, F401
