"""The Django Tasks API through the ``default`` backend (jobs.tasks_backend.VpayTaskBackend)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks import default_task_backend
from django_tasks.base import TaskResultStatus
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

from jobs import repository
from jobs.worker import Worker
from tests import tasks
from tests.queue_support import claim, count, execute, one, scalar, seconds_until_run

pytestmark = pytest.mark.django_db


def test_enqueue__returns_a_ready_result_with_a_uuid_id_and_writes_one_task_job():
    result = tasks.record.enqueue("hello", value="v")
    assert result.status == TaskResultStatus.READY
    assert str(uuid.UUID(result.id)) == result.id
    assert (result.args, result.kwargs, result.backend) == (["hello"], {"value": "v"}, "default")
    assert one("SELECT kind, queue, payload->>'task' FROM jobs WHERE job_id = %s", [result.id]) == (
        "task",
        "default",
        "tests.tasks.record",
    )
    assert count("jobs") == 1


def test_enqueue__run_after_becomes_a_delay_on_the_database_clock():
    result = tasks.record.using(run_after=timezone.now() + timedelta(minutes=10)).enqueue("later")
    # run_at - now() in SQL: ten minutes, less the few milliseconds the call took.
    assert 599 <= seconds_until_run(result.id) <= 600


def test_enqueue__run_after_in_the_past_is_due_at_once():
    result = tasks.record.using(run_after=timezone.now() - timedelta(hours=1)).enqueue("overdue")
    assert seconds_until_run(result.id) == pytest.approx(0, abs=0.5)


@pytest.mark.parametrize(("task_priority", "job_priority"), [(0, 0), (10, -10), (-5, 5), (100, -100), (-100, 100)])
def test_enqueue__a_higher_task_priority_is_a_lower_job_priority(task_priority, job_priority):
    result = tasks.record.using(priority=task_priority).enqueue("p")
    assert scalar("SELECT priority FROM jobs WHERE job_id = %s", [result.id]) == job_priority


def test_a_higher_priority_task_is_claimed_first():
    tasks.record.using(priority=-20).enqueue("low")
    urgent = tasks.record.using(priority=20).enqueue("urgent")
    tasks.record.enqueue("normal")
    (job,) = claim().jobs
    assert str(job.job_id) == urgent.id


def test_enqueue__refuses_a_queue_the_backend_does_not_declare_and_writes_nothing():
    with pytest.raises(InvalidTaskError, match="Queue 'elsewhere' is not valid"):
        tasks.record.using(queue_name="elsewhere").enqueue("x")
    assert count("jobs") == 0


def test_enqueue__checks_each_task_object_however_often_its_function_was_enqueued_before():
    # The backend remembers Task objects that passed; a variant of a remembered task
    # (using() makes a new object) is checked afresh, every time.
    tasks.record.enqueue("ok")
    tasks.record.enqueue("ok again")
    for _ in range(2):
        with pytest.raises(InvalidTaskError, match="Queue 'elsewhere' is not valid"):
            tasks.record.using(queue_name="elsewhere").enqueue("x")
    assert count("jobs") == 2


def test_get_result__follows_a_task_from_ready_through_running_to_successful(effects):
    result = tasks.record.enqueue("lifecycle")
    assert tasks.record.get_result(result.id).status == TaskResultStatus.READY

    (job,) = claim("worker-a").jobs  # leased: running somewhere
    running = tasks.record.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.args == ["lifecycle"]
    assert repository.release([(job.id, job.lease_token)], refund=True) == 1

    assert Worker(concurrency=1).run_once() == 1
    done = tasks.record.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    # Successes are not kept as rows: only the fence row remains, so no args and no value.
    assert (done.args, done.kwargs, done.return_value) == ([], {}, None)
    assert done.finished_at is not None
    assert effects("lifecycle") == [("lifecycle", "")]


def test_get_result__is_running_while_the_task_itself_runs(effects):
    result = tasks.record_own_status.enqueue("self")
    Worker(concurrency=1).run_once()
    assert effects("self") == [("self", TaskResultStatus.RUNNING)]
    assert tasks.record_own_status.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_get_result__is_failed_once_the_task_is_dead_lettered():
    result = tasks.fail_permanently.enqueue("doomed")
    Worker(concurrency=1).run_once()
    failed = tasks.fail_permanently.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.args == ["doomed"]
    (error,) = failed.errors
    assert error.exception_class_path == "vpay.dead_letter.permanent"
    assert "the far side refused doomed for good" in error.traceback


@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), "not-a-uuid", ""])
def test_get_result__of_an_unknown_id_raises_task_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_get_result__of_a_successful_task_whose_fence_expired_raises_task_result_does_not_exist(effects):
    result = tasks.record.enqueue("forgotten")
    Worker(concurrency=1).run_once()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    execute("UPDATE processed_jobs SET expires_at = now() - interval '1 second'")
    assert repository.delete_expired_fences() == 1
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)
