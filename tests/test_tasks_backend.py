"""The Django Tasks API through the ``default`` backend (jobs.adapters.tasks_backend.VpayTaskBackend)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import django
import pytest
from django.db import transaction
from django.utils import timezone

from jobs.adapters import postgres as queue
from jobs.adapters.tasks_backend import VpayTaskBackend, run_after_at
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from jobs.storage import fence_sql, leases
from jobs.tasks_api import InvalidTask, TaskResultDoesNotExist, TaskResultStatus, default_task_backend, task_enqueued
from tests import tasks
from tests.clock_support import skewed_env
from tests.conftest import ROOT, database_url
from tests.queue_support import claim, count, execute, one, scalar, seconds_until_run, task_payload

TWO_HOURS = 7200

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
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
        tasks.record.using(queue_name="elsewhere").enqueue("x")
    assert count("jobs") == 0


def test_enqueue__checks_each_task_object_however_often_its_function_was_enqueued_before():
    # The backend remembers Task objects that passed; a variant of a remembered task
    # (using() makes a new object) is checked afresh, every time.
    tasks.record.enqueue("ok")
    tasks.record.enqueue("ok again")
    for _ in range(2):
        with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
            tasks.record.using(queue_name="elsewhere").enqueue("x")
    assert count("jobs") == 2


def test_get_result__follows_a_task_from_ready_through_running_to_successful(effects):
    result = tasks.record.enqueue("lifecycle")
    assert tasks.record.get_result(result.id).status == TaskResultStatus.READY

    (job,) = claim("worker-a").jobs  # leased: running somewhere
    running = tasks.record.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.args == ["lifecycle"]
    assert leases.release([(job.id, job.lease_token)], refund=True) == 1

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


@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), "not-a-uuid", ""], ids=["a-fresh-uuid", "not-a-uuid", "empty"])
def test_get_result__of_an_unknown_id_raises_task_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_get_result__of_a_successful_task_whose_fence_expired_raises_task_result_does_not_exist(effects):
    result = tasks.record.enqueue("forgotten")
    Worker(concurrency=1).run_once()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    execute("UPDATE processed_jobs SET expires_at = now() - interval '1 second'")
    assert fence_sql.delete_expired_fences() == 1
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)


# --- edge cases: a path that no longer imports, the signal, run_after on a skewed host ---


@pytest.mark.parametrize("path", ["tests.tasks.no_longer_here", "tests.tasks._record", "tests.gone_module.task"])
def test_get_result__of_a_live_job_whose_task_no_longer_imports_raises_task_result_does_not_exist(path):
    job_id = queue.enqueue(JobKind.TASK, task_payload(path, "x"))
    with pytest.raises(TaskResultDoesNotExist, match="no longer imports as a task"):
        default_task_backend.get_result(str(job_id))


def test_get_result__of_a_dead_lettered_task_that_no_longer_imports_raises_task_result_does_not_exist(settings):
    settings.VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS = 0  # poison at once, not left for another release
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.no_longer_here"))
    Worker(concurrency=1).run_once()  # poison: dead-lettered on its first attempt (window 0)
    assert count("dead_letters", "job_id = %s", [str(job_id)]) == 1
    with pytest.raises(TaskResultDoesNotExist, match=r"tests\.tasks\.no_longer_here"):
        default_task_backend.get_result(str(job_id))


@pytest.fixture
def enqueued_signals():
    """Every ``task_enqueued`` the backend sends, as (sender, result id), in order."""
    seen: list[tuple[type, str]] = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    yield seen
    task_enqueued.disconnect(receiver)


@pytest.mark.django_db(transaction=True)  # real commits: on_commit callbacks run
def test_task_enqueued_fires_once_the_callers_transaction_commits(enqueued_signals):
    with transaction.atomic():
        result = tasks.record.enqueue("committed")
        assert enqueued_signals == []  # not yet: the job row is not visible to anyone
    assert enqueued_signals == [(VpayTaskBackend, result.id)]
    outside = tasks.record.enqueue("autocommit")  # no transaction: committed at once
    assert enqueued_signals[-1] == (VpayTaskBackend, outside.id)


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_never_fires_for_an_enqueue_that_rolled_back(enqueued_signals):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.record.enqueue("rolled back")
        raise RuntimeError("the caller's transaction fails")
    assert enqueued_signals == [] and count("jobs") == 0


@pytest.mark.django_db(transaction=True)
def test_a_failing_task_enqueued_receiver_does_not_undo_a_committed_enqueue(caplog):
    def broken(sender, task_result, **kwargs):
        raise ValueError("a receiver's bug")

    task_enqueued.connect(broken)
    try:
        result = tasks.record.enqueue("kept")  # does not raise: the job is committed
    finally:
        task_enqueued.disconnect(broken)
    assert count("jobs", "job_id = %s", [result.id]) == 1
    assert any("a receiver's bug" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")  # logged


def enqueue_on_a_skewed_host(tmp_path, offset_seconds: int, at: datetime) -> dict[str, str]:
    """Enqueue three ``run_after`` tasks from a real process whose wall clock is
    ``offset_seconds`` off the database's; returns their result ids by label."""
    code = textwrap.dedent(
        """
        import json, os
        from datetime import datetime, timedelta
        from django.utils import timezone
        from jobs.adapters.tasks_backend import run_after_at
        from tests import tasks

        at = datetime.fromisoformat(os.environ["VPAY_TEST_AT"])
        ids = {
            "relative": tasks.record.using(run_after=timezone.now() + timedelta(minutes=10)).enqueue("r").id,
            "instant": tasks.record.using(run_after=at).enqueue("i").id,
            "instant_on_the_database_clock": tasks.record.using(run_after=run_after_at(at)).enqueue("d").id,
        }
        print("IDS " + json.dumps(ids))
        """
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "VPAY_TEST_AT": at.isoformat(),
        **skewed_env("sitecustomize", offset_seconds, tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("IDS ")]
    return json.loads(line[4:])


@pytest.mark.django_db(transaction=True)  # the subprocess commits; this test reads it
@pytest.mark.parametrize("offset", [TWO_HOURS, -TWO_HOURS])
def test_run_after_on_a_host_whose_clock_is_off(tmp_path, offset):
    an_hour_from_now = scalar("SELECT now() + interval '1 hour'")
    ids = enqueue_on_a_skewed_host(tmp_path, offset, an_hour_from_now)
    # "In ten minutes" stays ten minutes on the database clock: the host only measured a
    # difference between two readings of its own clock.
    assert 540 <= seconds_until_run(ids["relative"]) <= 600
    # A bare instant is read on the host's clock, so it moves by the host's error (a
    # skewed-ahead host thinks an hour from now is an hour ago: due at once)...
    assert seconds_until_run(ids["instant"]) == pytest.approx(max(3600 - offset, 0), abs=60)
    # ...unless it is made relative on the database clock first.
    assert seconds_until_run(ids["instant_on_the_database_clock"]) == pytest.approx(3600, abs=60)


def test_run_after_at_refuses_a_naive_datetime():
    with pytest.raises(ValueError, match="aware"):
        run_after_at(datetime(2030, 1, 1, 9, 0))  # naive: no tzinfo


# --- the Tasks API of the installed Django (jobs/tasks_api.py) ------------------------------


def test_the_backend_and_its_tasks_speak_the_tasks_api_of_the_installed_django():
    # Django 6 ships the API as django.tasks; 5.2 has only the backport. A backend built on
    # the other one would accept a core @task at enqueue and its worker would then refuse it.
    api = "django.tasks." if django.VERSION >= (6, 0) else "django_tasks."
    result = tasks.record.enqueue("which api")
    assert [type(thing).__module__.startswith(api) for thing in (tasks.record, result)] == [True, True]
    assert any(base.__module__.startswith(api) for base in VpayTaskBackend.__mro__)
    assert default_task_backend.get_result(result.id).task is tasks.record


def test_only_jobs_tasks_api_imports_a_tasks_api_package():
    # Code written against one of the two (tests' task modules written as text included)
    # would pass on one Django and break on the other.
    importing = re.compile(r"^\s*(?:from|import)\s+(?:django_tasks|django\.tasks)\b", re.MULTILINE)
    offenders = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]  # .venv*, .pgdata, .git
        for name in files:
            path = Path(folder, name)
            if name.endswith(".py") and importing.search(path.read_text()):
                offenders.append(path.relative_to(ROOT).as_posix())
    assert offenders == ["jobs/tasks_api.py"]
