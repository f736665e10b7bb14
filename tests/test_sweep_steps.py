"""``sweep_expired`` runs every registered step, each isolated, and reschedules at once
only when a step reports that a full page made progress."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs import housekeeping, queue
from jobs.housekeeping import StepResult
from jobs.kinds import JobKind
from jobs.worker import Worker
from tests.queue_support import rows

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
