"""The checkpoint primitive in-process against the real database: a cursor stored with the
lease's heartbeat and read back by the next run, what is refused, and the reaper's
recovery cap (jobs/maintenance/reaper.py). The crash itself, with real worker processes, is in
tests/test_checkpoint_crash.py."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.primitives import checkpoints
from jobs.primitives.checkpoints import CheckpointRefused
from jobs.runner.context import JobContext, LeaseLost
from jobs.runner.worker import Worker
from tests.queue_support import claim, claimed_context, execute, expire_lease, one, scalar, task_payload

pytestmark = pytest.mark.django_db(transaction=True)


def claimed_sweep(worker: str = "worker-a") -> JobContext:
    """The customers sweep's row, claimed as a worker would: a kind that owns its transactions."""
    [job] = claim(worker).jobs
    assert job.kind == JobKind.SWEEP_IDLE_CUSTOMERS
    return claimed_context(job)


@pytest.fixture
def sweep_job():
    return queue.enqueue(JobKind.SWEEP_IDLE_CUSTOMERS, {}, dedupe_key="singleton:sweep_idle_customers")


def crash_and_rescue(job_id) -> tuple[int, int]:
    """The worker holding the job dies: its lease runs out and a reaper rescues it."""
    expire_lease(job_id)
    return Worker(concurrency=1).reap()


def test_a_checkpoint_is_stored_with_the_lease_and_is_the_next_runs_cursor(sweep_job):
    ctx = claimed_sweep()
    assert ctx.cursor is None  # a fresh pass
    before = scalar("SELECT lease_expires_at FROM jobs WHERE job_id = %s", [sweep_job])
    ctx.checkpoint(["2020-01-01T00:00:00.000001+00:00", "cus_42"])
    stored, expires = one("SELECT checkpoint::text, lease_expires_at FROM jobs WHERE job_id = %s", [sweep_job])
    stored = json.loads(stored)
    assert stored == ["2020-01-01T00:00:00.000001+00:00", "cus_42"]
    assert expires > before  # the same statement extended the lease
    assert crash_and_rescue(sweep_job) == (1, 0)
    assert claimed_sweep("worker-b").cursor == ["2020-01-01T00:00:00.000001+00:00", "cus_42"]


def test_a_cursor_reads_back_as_json_would_read_it_after_a_crash(sweep_job):
    import datetime

    ctx = claimed_sweep()
    at = datetime.datetime(2020, 1, 1, 12, 30, tzinfo=datetime.UTC)
    ctx.checkpoint((at, "cus_1"))
    assert ctx.cursor == ["2020-01-01T12:30:00Z", "cus_1"]  # the same in this run as in the next
    crash_and_rescue(sweep_job)
    assert claimed_sweep("worker-b").cursor == ctx.cursor


def test_a_checkpoint_of_none_clears_the_cursor_so_the_next_run_starts_a_new_pass(sweep_job):
    ctx = claimed_sweep()
    ctx.checkpoint({"after": "cus_9"})
    ctx.checkpoint(None)
    assert ctx.cursor is None
    assert scalar("SELECT checkpoint FROM jobs WHERE job_id = %s", [sweep_job]) is None


def test_a_loop_fenced_kind_is_refused_a_checkpoint_and_its_row_is_not_written(effects):
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    [job] = claim().jobs
    ctx = JobContext(job, 60.0, loop_fenced=True)
    with pytest.raises(CheckpointRefused, match="fenced by the loop"):
        ctx.checkpoint({"after": 1})
    assert scalar("SELECT checkpoint FROM jobs WHERE job_id = %s", [job_id]) is None


def test_a_cursor_that_is_not_small_json_is_refused_before_anything_is_written(sweep_job):
    ctx = claimed_sweep()
    with pytest.raises(CheckpointRefused, match="JSON"):
        ctx.checkpoint({"after": object()})
    with pytest.raises(CheckpointRefused, match="at most"):
        ctx.checkpoint("x" * (checkpoints.MAX_BYTES + 1))
    assert scalar("SELECT checkpoint FROM jobs WHERE job_id = %s", [sweep_job]) is None


def test_a_checkpoint_on_a_lease_taken_over_stores_nothing_and_raises_lease_lost(sweep_job):
    ctx = claimed_sweep()
    crash_and_rescue(sweep_job)
    with pytest.raises(LeaseLost):
        ctx.checkpoint({"after": "cus_1"})
    assert scalar("SELECT checkpoint FROM jobs WHERE job_id = %s", [sweep_job]) is None


def test_a_checkpointing_job_rescued_past_the_cap_without_progress_is_a_no_progress_dead_letter(sweep_job):
    with override_settings(VPAY_JOB_RECOVERY_CAP=2):
        claimed_sweep().checkpoint({"after": "cus_1"})
        assert crash_and_rescue(sweep_job) == (1, 0)  # rescue 1 since the cursor moved
        claimed_sweep("worker-b")
        assert crash_and_rescue(sweep_job) == (1, 0)  # rescue 2: the cap
        assert scalar("SELECT recoveries FROM jobs WHERE job_id = %s", [sweep_job]) == 2
        claimed_sweep("worker-c")
        assert crash_and_rescue(sweep_job) == (0, 1)  # past it: buried, not handed out
    assert scalar("SELECT count(*) FROM jobs WHERE job_id = %s", [sweep_job]) == 0
    cause, error = one("SELECT cause, last_error FROM dead_letters WHERE job_id = %s", [sweep_job])
    assert cause == "no_progress"
    assert "3 times since its checkpoint last moved (recovery cap 2)" in error and "cus_1" in error


def test_a_cursor_that_moves_between_crashes_resets_the_count(sweep_job):
    with override_settings(VPAY_JOB_RECOVERY_CAP=1):
        claimed_sweep().checkpoint({"after": "cus_1"})
        crash_and_rescue(sweep_job)
        claimed_sweep("worker-b").checkpoint({"after": "cus_2"})  # progress
        assert scalar("SELECT recoveries FROM jobs WHERE job_id = %s", [sweep_job]) == 0
        assert crash_and_rescue(sweep_job) == (1, 0)
        ctx = claimed_sweep("worker-c")
        ctx.checkpoint({"after": "cus_2"})  # the same cursor again is not progress
        assert scalar("SELECT recoveries FROM jobs WHERE job_id = %s", [sweep_job]) == 1
        assert crash_and_rescue(sweep_job) == (0, 1)


def test_a_job_without_a_checkpoint_is_bounded_by_its_attempts_not_the_recovery_cap(sweep_job):
    execute("UPDATE jobs SET max_attempts = 10 WHERE job_id = %s", [sweep_job])
    with override_settings(VPAY_JOB_RECOVERY_CAP=1):
        for worker in ("worker-a", "worker-b", "worker-c"):
            claimed_sweep(worker)
            assert crash_and_rescue(sweep_job) == (1, 0)
    assert scalar("SELECT recoveries FROM jobs WHERE job_id = %s", [sweep_job]) == 0


def test_each_sweep_step_keeps_its_own_cursor_in_the_sweeps_one_checkpoint():
    from jobs.maintenance.housekeeping import StepContext

    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="singleton:sweep_expired")
    [job] = claim().jobs
    ctx, cursors = claimed_context(job), {}
    sessions, other = StepContext(ctx, "checkout_sessions", cursors), StepContext(ctx, "other", cursors)
    sessions.checkpoint(["2020-01-01T00:00:00Z", "cs_7"])
    other.checkpoint(None)  # another step's pass ended: the first one's place stays
    assert json.loads(scalar("SELECT checkpoint::text FROM jobs WHERE job_id = %s", [job_id])) == {
        "checkout_sessions": ["2020-01-01T00:00:00Z", "cs_7"]
    }
    assert sessions.cursor == ["2020-01-01T00:00:00Z", "cs_7"] and other.cursor is None
    sessions.checkpoint(None)  # every step's pass ended: the next sweep starts over
    assert scalar("SELECT checkpoint FROM jobs WHERE job_id = %s", [job_id]) is None
