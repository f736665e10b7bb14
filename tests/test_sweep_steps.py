"""``sweep_expired`` runs every registered step, each isolated, and reschedules at once
only when a step reports that a full page made progress."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from jobs import JobCancelled, current_job
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance import housekeeping
from jobs.maintenance.housekeeping import StepResult
from jobs.models import Alert
from jobs.runner.worker import Worker
from jobs.services import cancels
from tests.queue_support import execute, make_due, rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def steps(monkeypatch):
    """Replace the app-registered steps for one test (the built-in ones stay)."""
    registered: dict = {}
    monkeypatch.setattr(housekeeping, "_STEPS", registered)
    return registered


def run_sweep() -> float:
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="singleton:sweep_expired")
    assert Worker(concurrency=1).run_once() == 1
    [(seconds,)] = rows("SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE job_id = %s", [job_id])
    return seconds


@pytest.mark.django_db(transaction=True)  # the sweep runs in autocommit, as in production
def test_a_failing_step_does_not_stop_the_steps_after_it(steps, caplog):
    ran = []

    def broken(ctx):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        return StepResult(0)

    def healthy(ctx):
        ran.append("healthy")
        return StepResult(3)

    housekeeping.register_sweep_step("broken", broken)
    housekeeping.register_sweep_step("healthy", healthy)
    assert 3590.0 < run_sweep() <= 3600.0
    assert ran == ["healthy"]
    failed = [r for r in caplog.records if r.getMessage() == "sweep step failed"]
    assert [r.step for r in failed] == ["broken"] and "division by zero" in failed[0].error
    summary = next(r for r in caplog.records if r.getMessage() == "sweep_expired")
    assert summary.counts["healthy"] == 3 and "broken" not in summary.counts


def test_a_full_page_that_made_progress_reschedules_at_once(steps):
    housekeeping.register_sweep_step("busy", lambda ctx: StepResult(100, more=True))
    assert run_sweep() == 0.0


def test_a_step_name_is_registered_once(steps):
    housekeeping.register_sweep_step("once", lambda ctx: StepResult(0))
    with pytest.raises(RuntimeError, match="already registered"):
        housekeeping.register_sweep_step("once", lambda ctx: StepResult(0))
    with pytest.raises(RuntimeError, match="already registered"):
        housekeeping.register_sweep_step("leases", lambda ctx: StepResult(0))
    with pytest.raises(ValueError, match="1 to 100 characters"):
        housekeeping.register_sweep_step("x" * 101, lambda ctx: StepResult(0))


def sweep_again() -> None:
    """The singleton's next pass: its row lives on an hour out; make it due and run the
    worker until it has run (an alert's send_alert job may be claimed first)."""
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="singleton:sweep_expired")
    [(job_id,)] = rows("SELECT job_id FROM jobs WHERE kind = 'sweep_expired'") if job_id is None else [(job_id,)]
    make_due(job_id)
    due = "SELECT 1 FROM jobs WHERE job_id = %s AND run_at <= now()"
    for _ in range(5):
        if not rows(due, [str(job_id)]):
            return
        Worker(concurrency=1).run_once()
    pytest.fail("the sweep did not run")


@pytest.mark.django_db(transaction=True)
def test_a_step_failing_on_consecutive_passes_alerts_once_at_the_bound_and_re_arms_after_a_success(steps):
    health = {"broken": True}

    def flaky(ctx):
        if health["broken"]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        return StepResult(0)

    housekeeping.register_sweep_step("flaky", flaky)
    for _ in range(housekeeping.SWEEP_STEP_ALERT_AFTER - 1):
        sweep_again()
    assert not Alert.objects.exists()  # a warning each pass, no alert yet
    for _ in range(3):
        sweep_again()  # the bound, and past it: one alert, not one an hour
    [first] = Alert.objects.all()
    assert first.source == "jobs.sweep_step_failing" and first.key.startswith("sweep_step_failing:flaky:")
    assert first.details["step"] == "flaky" and first.details["consecutive_failures"] == 3
    assert "division by zero" in first.details["error"]
    # Counted in the database, so a restarted worker keeps counting.
    assert rows("SELECT failures FROM sweep_step_streaks WHERE step = 'flaky'") == [(5,)]
    health["broken"] = False
    sweep_again()  # a success re-arms
    assert rows("SELECT failures FROM sweep_step_streaks WHERE step = 'flaky'") == []
    health["broken"] = True
    for _ in range(housekeeping.SWEEP_STEP_ALERT_AFTER):
        sweep_again()
    keys = set(Alert.objects.values_list("key", flat=True))
    assert len(keys) == 2 and first.key in keys  # a new streak is a new alert


@pytest.mark.django_db(transaction=True)
def test_a_step_that_skips_failing_rows_on_every_pass_alerts_too(steps):
    housekeeping.register_sweep_step("skips", lambda ctx: StepResult(4, failed=1))
    for _ in range(housekeeping.SWEEP_STEP_ALERT_AFTER):
        sweep_again()
    [alert] = Alert.objects.all()
    assert alert.details["step"] == "skips" and alert.details["error"] == "1 row(s) failed and were skipped"


# --- what stops the run stops the pass ------------------------------------------------------------


def run_sweep_on_a_live_worker() -> uuid.UUID:
    """One pass through a worker with its ``workers`` row (so a cancel is a request)."""
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="singleton:sweep_expired")
    worker = Worker(worker_id="w-sweep", concurrency=1)
    worker.heartbeat()
    assert worker.run_once() == 1
    return job_id


def stopping_pass(steps, stop) -> list[str]:
    """Register a step that calls ``stop(ctx)`` and one after it; answer the steps that ran
    after the stop."""
    ran: list[str] = []
    housekeeping.register_sweep_step("stops", stop)
    housekeeping.register_sweep_step("after", lambda ctx: ran.append("after") or StepResult(0))
    return ran


def not_a_step_failure(caplog) -> None:
    assert not [r for r in caplog.records if r.getMessage() == "sweep step failed"]
    assert rows("SELECT step FROM sweep_step_streaks") == []


@pytest.mark.django_db(transaction=True)
def test_a_lease_lost_mid_step_stops_the_pass_instead_of_counting_as_a_step_failure(steps, caplog):
    def taken_over(ctx):
        # Another worker's reaper took the job: its lease token is no longer ours.
        execute("UPDATE jobs SET lease_token = gen_random_uuid() WHERE job_id = %s", [str(ctx.job_id)])
        ctx.heartbeat()
        return StepResult(0)

    ran = stopping_pass(steps, taken_over)
    run_sweep_on_a_live_worker()
    assert ran == []  # nothing more runs without the lease
    not_a_step_failure(caplog)
    assert any(r.getMessage() == "lease lost while the handler ran" for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_an_operators_cancel_mid_step_stops_the_pass_and_ends_the_job_cancelled(steps, caplog):
    def cancelled(ctx):
        cancels.job_cancel(job_id=ctx.job_id, actor="olga", reason="stop the sweep")
        ctx.heartbeat()
        return StepResult(0)

    ran = stopping_pass(steps, cancelled)
    job_id = run_sweep_on_a_live_worker()
    assert ran == []
    not_a_step_failure(caplog)
    assert rows("SELECT cause, discarded_by FROM dead_letters WHERE job_id = %s", [str(job_id)]) == [
        ("cancelled", "olga")
    ]


@pytest.mark.django_db(transaction=True)
def test_a_pass_past_its_timeout_stops_at_the_next_heartbeat_instead_of_counting_as_a_step_failure(steps, caplog):
    def overran(ctx):
        current_job().started_monotonic -= 10_000  # the run's budget is spent
        ctx.heartbeat()
        return StepResult(0)

    ran = stopping_pass(steps, overran)
    job_id = run_sweep_on_a_live_worker()
    assert ran == []
    not_a_step_failure(caplog)
    # An ordinary transient failure of the run: retried on the kind's backoff.
    assert rows("SELECT attempts, last_error LIKE %s FROM jobs WHERE job_id = %s", ["%timeout%", str(job_id)]) == [
        (1, True)
    ]


@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_a_step_raises_of_its_own_accord_is_that_steps_failure(steps, caplog):
    def refuses(ctx):
        raise JobCancelled()  # names no job: not the heartbeat's

    ran = stopping_pass(steps, refuses)
    run_sweep_on_a_live_worker()
    assert ran == ["after"]
    assert [r.step for r in caplog.records if r.getMessage() == "sweep step failed"] == ["stops"]
