"""The processed_jobs fence and dead letters: the acceptance criteria that belong to the queue
(processed-jobs-and-dead-letters.md)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction
from prometheus_client import REGISTRY

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.models import DeadLetter
from jobs.primitives import fence
from jobs.runner.report import Report
from jobs.runner.settling import Settler
from jobs.runner.worker import Worker
from jobs.storage import fence_sql
from tests import tasks
from tests.queue_support import claim, count, execute, expire_lease, rows, scalar, task_payload


def duplicates_skipped(kind: str = "task") -> float:
    return REGISTRY.get_sample_value("vpay_jobs_duplicates_skipped_total", {"kind": kind}) or 0.0


def wait_until(predicate, timeout: float = 5.0, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.01)


# --- 1. the same job_id processed twice concurrently: exactly one effect --------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_run_twice_concurrently_by_a_reaped_worker_and_its_successor_has_exactly_one_effect(effects):
    result = tasks.record_slowly.enqueue("concurrent", 0.8)
    late, successor = Worker(worker_id="late", concurrency=1), Worker(worker_id="successor", concurrency=1)
    errors = []

    def run_late_worker() -> None:
        try:
            late.run_once()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run_late_worker)
    thread.start()
    try:
        wait_until(lambda: scalar("SELECT locked_by FROM jobs") == "late", message="the first claim")
        # While the late worker's handler still runs, its lease expires and is reaped, and a
        # successor claims and runs the same job_id.
        expire_lease(result.id)
        assert successor.reap() == (1, 0)
        assert successor.run_once() == 1
    finally:
        thread.join(timeout=10)
    assert errors == []
    assert effects("concurrent") == [("concurrent", "")]
    assert count("processed_jobs", "job_id = %s", [result.id]) == 1
    assert count("jobs") == 0
    assert count("dead_letters") == 0
    # Exactly one of the two settled the job; the other found its lease gone.
    reports = late.report(), successor.report()
    assert sorted((r.finished, r.lost) for r in reports) == [(0, 1), (1, 0)]


def _backend_pid_waiting_on_a_lock(pid: int) -> bool:
    return bool(scalar("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_a_second_transaction_on_the_same_job_id_waits_for_the_first_and_then_knows(effects, first_commits):
    job_id = uuid.uuid4()
    second: dict = {}
    second_started = threading.Event()

    def second_run() -> None:
        try:
            with transaction.atomic():
                second["pid"] = connection.connection.info.backend_pid
                second_started.set()
                second["first_time"] = fence.first_time(job_id, "task")
                if second["first_time"]:
                    tasks.record.call("fenced", "second")
        finally:
            connection.close()

    with transaction.atomic():
        assert fence.first_time(job_id, "task") is True
        tasks.record.call("fenced", "first")
        thread = threading.Thread(target=second_run)
        thread.start()
        assert second_started.wait(5)
        deadline = time.monotonic() + 5
        while not _backend_pid_waiting_on_a_lock(second["pid"]):
            assert time.monotonic() < deadline, "the second transaction never blocked on the fence"
            time.sleep(0.02)
        # The second run is parked on the fence's primary key while the first is in flight.
        assert "first_time" not in second
        if not first_commits:
            transaction.set_rollback(True)
    thread.join(timeout=10)
    if first_commits:
        assert second["first_time"] is False
        assert effects("fenced") == [("fenced", "first")]
    else:
        # The first run's effect and fence went away together; the second does the work once.
        assert second["first_time"] is True
        assert effects("fenced") == [("fenced", "second")]
    assert count("processed_jobs", "job_id = %s", [job_id]) == 1


# --- 2. a crash between the work and the fence leaves neither ------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_crash_between_the_work_and_the_fence_leaves_neither(effects):
    result = tasks.record_then_crash.enqueue("crashed")
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert effects("crashed") == []
    assert count("processed_jobs") == 0
    # The job itself is still live, waiting for its retry.
    assert worker.report().retried == 1
    row = rows("SELECT attempts, locked_at, last_error FROM jobs WHERE job_id = %s", [result.id])
    assert row[0][:2] == (1, None)
    assert "induced failure after the effect" in row[0][2]


# --- first_time's own contract -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_first_time__outside_a_transaction_refuses_and_writes_nothing():
    with pytest.raises(RuntimeError, match="inside the transaction"):
        fence.first_time(uuid.uuid4(), "task")
    assert count("processed_jobs") == 0


@pytest.mark.django_db
def test_first_time__a_duplicate_returns_false_and_increments_the_duplicates_metric():
    job_id = uuid.uuid4()
    before = duplicates_skipped("sweep_expired")
    with transaction.atomic():
        assert fence.first_time(job_id, "sweep_expired", subject="s") is True
    assert duplicates_skipped("sweep_expired") == before
    with transaction.atomic():
        assert fence.first_time(job_id, "sweep_expired", subject="s") is False
    assert duplicates_skipped("sweep_expired") == before + 1
    assert count("processed_jobs", "job_id = %s", [job_id]) == 1


@pytest.mark.django_db
def test_first_time__writes_a_fence_row_expiring_after_the_configured_ttl(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 86_400
    job_id = uuid.uuid4()
    with transaction.atomic():
        fence.first_time(job_id, "task", subject="x" * 300)
    ttl, subject = rows(
        "SELECT extract(epoch FROM expires_at - processed_at)::float8, subject FROM processed_jobs WHERE job_id = %s",
        [job_id],
    )[0]
    assert ttl == 86_400
    assert subject == "x" * 255  # bounded to the column


# --- 8. a successful job writes no row beyond its fence ------------------------------------


@pytest.mark.django_db
def test_a_successful_task_leaves_no_job_row_one_fence_row_and_no_dead_letter(effects):
    result = tasks.record.enqueue("succeeded", "v")
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert worker.report().finished == 1
    assert effects("succeeded") == [("succeeded", "v")]
    assert count("jobs") == 0
    assert rows("SELECT job_id::text, kind, subject FROM processed_jobs") == [(result.id, "task", "tests.tasks.record")]
    assert count("dead_letters") == 0


# --- 6. TTL cleanup --------------------------------------------------------------------------


def _fence(offset: str) -> uuid.UUID:
    """A fence row expiring at ``now() + offset`` (an SQL interval)."""
    job_id = uuid.uuid4()
    execute(
        "INSERT INTO processed_jobs (job_id, kind, subject, processed_at, expires_at)"
        " VALUES (%s, 'task', '', now() - interval '8 days', now() + %s::interval)",
        [job_id, offset],
    )
    return job_id


def _fences() -> set[uuid.UUID]:
    return {r[0] for r in rows("SELECT job_id FROM processed_jobs")}


@pytest.mark.django_db
def test_delete_expired_fences__removes_expired_rows_and_never_one_still_inside_its_window():
    expired = {_fence("-1 second"), _fence("-3 days")}
    live = {_fence("1 second"), _fence("7 days"), _fence("0 seconds")}
    with transaction.atomic():
        fence.first_time(uuid.uuid4(), "task")  # written just now, by the fence itself
    live |= _fences() - expired - live
    assert fence_sql.delete_expired_fences() == 2
    assert _fences() == live


@pytest.mark.django_db
def test_delete_expired_fences__deletes_at_most_a_page():
    for _ in range(3):
        _fence("-1 hour")
    kept = _fence("1 hour")
    assert fence_sql.delete_expired_fences(page=2) == 2
    assert fence_sql.delete_expired_fences(page=2) == 1
    assert fence_sql.delete_expired_fences(page=2) == 0
    assert _fences() == {kept}


@pytest.mark.django_db
def test_the_sweep_job_removes_expired_fences_keeps_live_ones_and_reschedules_itself_an_hour_out():
    expired, live = _fence("-1 minute"), _fence("1 minute")
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="singleton:sweep_expired")
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert _fences() == {live}
    assert expired not in _fences()
    assert worker.report().rescheduled == 1
    # The singleton stays live, an hour out on the database clock, with no attempt spent.
    assert rows(
        "SELECT extract(epoch FROM run_at - now())::float8, attempts, locked_at FROM jobs WHERE job_id = %s",
        [job_id],
    ) == [(3600.0, 0, None)]


# --- 5. replay of a dead letter with the same job_id -----------------------------------------


def _replay(letter: DeadLetter) -> uuid.UUID | None:
    """Replay as the runbook does: re-enqueue the dead letter's payload under its job_id."""
    return queue.enqueue(
        letter.kind,
        letter.payload,
        job_id=letter.job_id,
        queue=letter.queue,
        tenant=letter.tenant,
        correlation_id=letter.correlation_id,
    )


@pytest.mark.django_db
def test_replaying_a_dead_letter_whose_effect_happened_has_no_second_effect(effects, settings):
    settings.VPAY_ALERT_QUEUE = "alerts"  # the dead letter's alert job, out of this worker's way
    job_id = queue.enqueue(
        JobKind.TASK, task_payload("tests.tasks.record", "replayed"), max_attempts=1, correlation_id="c-9"
    )
    # A worker claims the job on its only attempt and commits the effect with its fence, as
    # a fenced handler does...
    (job,) = claim("worker-a").jobs
    with transaction.atomic():
        assert fence.first_time(job.job_id, job.kind, "tests.tasks.record") is True
        tasks.record.call("replayed")
    # ...then dies before deleting the row: the reaper buries the job.
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (0, 1)
    letter = DeadLetter.objects.get(job_id=job_id)
    assert letter.cause == "crashed_worker"
    assert effects("replayed") == [("replayed", "")]

    before = duplicates_skipped()
    assert _replay(letter) == job_id
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    assert worker.report().finished == 1
    assert effects("replayed") == [("replayed", "")]
    assert duplicates_skipped() == before + 1
    assert count("jobs", "queue = 'default'") == 0


@pytest.mark.django_db
def test_replaying_a_dead_letter_in_bulk_twice_has_exactly_one_effect(effects, settings):
    settings.VPAY_ALERT_QUEUE = "alerts"  # the dead letter's alert job, out of this worker's way
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.record", "bulk"), max_attempts=1)
    claim("worker-a")
    expire_lease(job_id)
    Worker(concurrency=1).reap()  # died before doing anything: no effect yet
    letter = DeadLetter.objects.get(job_id=job_id)
    assert effects("bulk") == []

    worker = Worker(concurrency=1)
    for _ in range(2):  # an operator replays the same dead letter twice
        assert _replay(letter) == job_id
        assert worker.run_once() == 1
    assert worker.report().finished == 2
    assert effects("bulk") == [("bulk", "")]
    assert count("processed_jobs", "job_id = %s", [job_id]) == 1


# --- 9. a fenced handler that wrote nothing: its fence rides with the batched finish -------


def _run_deferring(path: str, *args):
    from jobs.runner.invoke import run_job

    queue.enqueue(JobKind.TASK, task_payload(path, *args), tenant="t")
    job = claim().jobs[0]
    return job, run_job(job, [], concurrency=1, defer_fence=True)


@pytest.mark.django_db(transaction=True)
def test_a_fenced_handler_that_wrote_nothing_leaves_its_fence_to_the_batched_finish():
    job, ran = _run_deferring("tests.tasks.noop")
    assert (ran.committed, ran.fence_subject) == (False, "tests.tasks.noop")
    assert count("processed_jobs") == 0 and count("jobs") == 1  # nothing written yet
    settler = Settler(Report())
    settler.finish([job], {job.id: ran.fence_subject})
    assert count("jobs") == 0
    assert rows("SELECT job_id, kind, subject FROM processed_jobs") == [(job.job_id, "task", "tests.tasks.noop")]
    assert settler.report.finished == 1


@pytest.mark.django_db(transaction=True)
def test_a_fenced_handler_that_wrote_or_waits_on_its_commit_commits_its_own_transaction(effects):
    _, ran = _run_deferring("tests.tasks.record", "own")
    assert (ran.committed, ran.fence_subject) == (True, None)
    _, ran = _run_deferring("tests.tasks.record_on_commit", "after-commit")
    assert (ran.committed, ran.fence_subject) == (True, None)  # its callback ran after the fence's commit
    assert effects("after-commit") == [("after-commit", "")]
    assert count("processed_jobs") == 2 and count("jobs") == 0


@pytest.mark.django_db(transaction=True)
def test_a_batched_fence_is_written_only_with_a_delete_that_matched_and_a_second_one_is_a_duplicate():
    held, ran_held = _run_deferring("tests.tasks.noop")
    lost, ran_lost = _run_deferring("tests.tasks.noop")
    again, ran_again = _run_deferring("tests.tasks.noop")
    plain = queue.enqueue(JobKind.TASK, task_payload(), tenant="t")
    unfenced = claim().jobs[0]
    assert unfenced.job_id == plain
    execute("UPDATE jobs SET lease_token = gen_random_uuid() WHERE id = %s", [lost.id])  # taken over
    # Another run of `again`'s job_id committed its fence first.
    execute(
        "INSERT INTO processed_jobs (job_id, kind, subject, processed_at, expires_at)"
        " VALUES (%s, 'task', '', now(), now() + interval '1 day')",
        [again.job_id],
    )
    before = duplicates_skipped()
    settler = Settler(Report())
    settler.finish(
        [held, lost, again, unfenced],
        {held.id: ran_held.fence_subject, lost.id: ran_lost.fence_subject, again.id: ran_again.fence_subject},
    )
    assert {r[0] for r in rows("SELECT job_id FROM processed_jobs")} == {held.job_id, again.job_id}
    assert rows("SELECT subject FROM processed_jobs WHERE job_id = %s", [again.job_id]) == [("",)]
    assert rows("SELECT id FROM jobs") == [(lost.id,)]  # the successor holds it
    assert duplicates_skipped() == before + 1
    assert settler.report.finished == 3 and settler.report.lost == 1
