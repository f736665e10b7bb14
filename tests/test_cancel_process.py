"""Cancel against real ``runworker`` processes: a task that heartbeats is stopped within a
heartbeat, and a job whose worker was SIGKILLed is cancelled at once or at the next reap."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from jobs.adapters.postgres import enqueue
from jobs.models import DeadLetter
from jobs.primitives.cancel_decisions import JobPhase
from jobs.services import cancels
from jobs.tasks_api import TaskResultStatus, default_task_backend
from tests.conftest import wait_for
from tests.queue_support import count, scalar

pytestmark = pytest.mark.django_db(transaction=True)


def start_heartbeating_task(tmp_path, label: str) -> tuple:
    started = tmp_path / f"started-{label}"
    job_id = enqueue(
        "task", {"task": "tests.tasks.heartbeat_until_cancelled", "args": [label, 60, str(started)], "kwargs": {}}
    )
    # The handler's open() creates the file before its line is written: wait for the line, or
    # a kill in between loses it and a test counting runs reads none.
    wait_for(
        lambda: started.exists() and "started" in started.read_text(),
        timeout=30,
        message="the task's handler to start",
    )
    return job_id, started


def test_a_running_task_that_heartbeats_ends_cancelled_within_a_heartbeat_of_the_request(
    effects, start_worker, tmp_path
):
    worker = start_worker("--concurrency", "2")
    job_id, _ = start_heartbeating_task(tmp_path, "long")
    out = StringIO()
    began = time.monotonic()
    call_command("jobs", "cancel", str(job_id), "--reason", "merchant asked", "--wait", "10", stdout=out)
    took = time.monotonic() - began
    assert "cancel requested" in out.getvalue() and "cancelled: dead letter #" in out.getvalue()
    assert took < 3, f"the handler heartbeats every 50 ms; it took {took:.2f} s to stop"
    letter = DeadLetter.objects.get(job_id=job_id)
    assert (letter.cause, letter.discard_reason) == ("cancelled", "merchant asked")
    assert letter.discarded_by.startswith("shell:")
    assert effects("long") == []  # the task's transaction rolled back with the cancel
    assert count("jobs", "kind = 'task'") == 0 and worker.proc.poll() is None
    # The Tasks API reports it.
    result = default_task_backend.get_result(str(job_id))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "vpay.dead_letter.cancelled"


def test_a_job_whose_worker_was_killed_is_cancelled_at_once_once_its_lease_ran_out(effects, start_worker, tmp_path):
    worker = start_worker("--concurrency", "1", "--heartbeat", "0.5")  # a lease of 3 s
    job_id, _ = start_heartbeating_task(tmp_path, "orphan")
    worker.kill()
    # Dead as the cancel judges it: the job's lease ran out and so did its worker's beat. The
    # worker's row beats apart from the job's lease, up to a heartbeat later, so the lease
    # alone can lapse first.
    wait_for(
        lambda: scalar(
            "SELECT j.lease_expires_at < now()"
            " AND coalesce((SELECT w.heartbeat_at < now() - make_interval(secs => w.lease_seconds)"
            " FROM workers w WHERE w.id = j.locked_by), true)"
            " FROM jobs j WHERE j.job_id = %s",
            [str(job_id)],
        ),
        timeout=10,
        message="the dead worker's lease and beat to run out",
    )
    # No worker is left to reap it: the cancel itself ends it.
    result = cancels.job_cancel(job_id=job_id, actor="olga", reason="worker gone")
    assert (result.ended, result.phase) == (True, JobPhase.ORPHANED)
    assert DeadLetter.objects.get(job_id=job_id).cause == "cancelled"


def test_a_request_made_just_before_the_worker_died_ends_the_job_at_the_next_reap_without_running_it_again(
    effects, start_worker, tmp_path
):
    doomed = start_worker("--concurrency", "1", "--heartbeat", "0.5")
    job_id, started = start_heartbeating_task(tmp_path, "rescued")
    doomed.kill()
    # Its lease is still valid: nobody can tell yet that the worker is dead, so a request.
    result = cancels.job_cancel(job_id=job_id, actor="olga", reason="stop it")
    assert (result.ended, result.phase) == (False, JobPhase.RUNNING)
    start_worker("--concurrency", "1", "--heartbeat", "0.5")
    wait_for(lambda: DeadLetter.objects.filter(job_id=job_id).exists(), timeout=20, message="the cancelled letter")
    letter = DeadLetter.objects.get(job_id=job_id)
    assert (letter.cause, letter.discarded_by, letter.discard_reason) == ("cancelled", "olga", "stop it")
    assert started.read_text().count("started") == 1  # the reaper freed it and the sweep ended it: no second run
