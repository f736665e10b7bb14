"""jobs.runner.worker.Worker driven in-process through its step methods (run_once, reap)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.conf import settings
from prometheus_client import REGISTRY

from jobs import registry
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.models import DeadLetter
from jobs.runner import drain
from jobs.runner.context import LeaseLost
from jobs.runner.worker import Worker
from jobs.storage import leases, repository
from tests import tasks
from tests.queue_support import (
    claim,
    claimed_context,
    count,
    execute,
    expire_lease,
    make_due,
    one,
    rows,
    scalar,
    seconds_until_run,
    task_payload,
)


def task_policy():
    return registry.retry_policy(registry.get("task"))


def job_row(job_id) -> dict:
    columns = (
        "attempts",
        "max_attempts",
        "deferrals",
        "locked_by",
        "lease_token",
        "last_error",
        "crashes",
        "unrunnable_since",
    )
    row = one(f"SELECT {', '.join(columns)} FROM jobs WHERE job_id = %s", [str(job_id)])
    return dict(zip(columns, row, strict=True)) if row else {}


# --- transient failures: 5 attempts with growing backoff, then a dead letter -----------------


def _seconds_until_rescheduled_run(job_id) -> float:
    """``run_at`` minus ``now()``: a reschedule's delay counts from its transaction's start,
    which is the whole test's here (statement_timestamp() was the read's, later by what the
    runs took, past the tolerance on a loaded machine when the jitter drew near zero)."""
    return scalar("SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE job_id = %s", [str(job_id)])


def _fail_until_dead_lettered(job_id) -> list[tuple[int, float, float]]:
    """Run the job until it leaves the queue; returns (attempt, delay, ceiling) per retry."""
    worker = Worker(concurrency=1)
    policy = task_policy()
    retries = []
    for attempt in range(1, policy.max_attempts + 1):
        assert worker.run_once() == 1
        if attempt < policy.max_attempts:
            row = job_row(job_id)
            assert (row["attempts"], row["locked_by"], row["lease_token"]) == (attempt, None, None)
            retries.append((attempt, _seconds_until_rescheduled_run(job_id), policy.ceiling(attempt)))
            make_due(job_id)  # skip the wait
    assert count("jobs", "kind <> 'send_alert'") == 0  # only the alert the dead letter raised
    report = worker.report()
    assert (report.claimed, report.retried, report.dead_lettered) == (5, 4, 1)
    return retries


@pytest.mark.django_db
def test_a_transient_failure_retries_five_times_within_growing_backoff_ceilings_then_dead_letters():
    result = tasks.fail_transiently.using(priority=5).enqueue("flaky")
    retries = _fail_until_dead_lettered(result.id)
    ceilings = [c for _, _, c in retries]
    assert ceilings == [30, 60, 120, 240]
    for attempt, delay, ceiling in retries:
        # Each reschedule's run_at - now(), measured by PostgreSQL, is a full-jitter backoff.
        assert -0.05 <= delay <= ceiling, (
            attempt,
            delay,
            ceiling,
        )  # a wait near zero is read a statement after it was written
    letter = DeadLetter.objects.get(job_id=result.id)
    assert (letter.cause, letter.error_category, letter.attempts, letter.max_attempts) == (
        "exhausted",
        "transient",
        5,
        5,
    )
    assert "TransientError: transient failure for flaky" in letter.last_error
    assert letter.payload == task_payload("tests.tasks.fail_transiently", "flaky") | {"backend": "default"}
    assert (letter.kind, letter.queue, letter.priority, letter.state) == ("task", "default", -5, "pending_review")


@pytest.mark.django_db
def test_the_task_retry_policy_follows_the_settings_at_use_time(settings):
    settings.VPAY_TASK_MAX_ATTEMPTS = 5
    settings.VPAY_TASK_RETRY_BASE_SECONDS = 0.5
    settings.VPAY_TASK_RETRY_CAP_SECONDS = 1.5
    result = tasks.fail_transiently.enqueue("configured")
    retries = _fail_until_dead_lettered(result.id)
    # With the default policy (30 s base) four waits this short would be all but impossible.
    assert [(a, c) for a, _, c in retries] == [(1, 0.5), (2, 1.0), (3, 1.5), (4, 1.5)]
    # Full jitter may draw a wait near zero, and the wait is read by a later statement than
    # the one that wrote it: allow the milliseconds between them.
    assert all(-0.05 <= delay <= ceiling for _, delay, ceiling in retries)


@pytest.mark.django_db
def test_a_job_enqueued_with_fewer_attempts_dead_letters_after_them():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.fail_transiently", "x"), max_attempts=2)
    worker = Worker(concurrency=1)
    worker.run_once()
    make_due(job_id)
    worker.run_once()
    assert DeadLetter.objects.get(job_id=job_id).attempts == 2


# --- poison, permanent, configuration: no retries --------------------------------------------

BAD_PAYLOADS = {
    "wrong type": {"task": 1, "args": [], "kwargs": {}},
    "missing field": {"task": "tests.tasks.noop"},
    "unknown field": {"task": "tests.tasks.noop", "args": [], "kwargs": {}, "extra": True},
    "not an object": ["tests.tasks.noop"],
    "a string": "tests.tasks.noop",
    "json null": None,
}


def past_the_unrunnable_window(job_id) -> None:
    """Workers have been unable to run it for longer than the window; due now."""
    execute(
        "UPDATE jobs SET unrunnable_since = now() - make_interval(secs => %s), run_at = now() WHERE job_id = %s",
        [settings.VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS + 1, job_id],
    )


@pytest.mark.django_db
@pytest.mark.parametrize("payload", list(BAD_PAYLOADS.values()), ids=list(BAD_PAYLOADS))
def test_a_schema_invalid_payload_is_left_for_another_worker_then_dead_letters_as_poison_past_the_window(payload):
    job_id = scalar(
        "INSERT INTO jobs (job_id, kind, payload, run_at) VALUES (gen_random_uuid(), 'task', %s::jsonb, now())"
        " RETURNING job_id",
        [json.dumps(payload)],
    )
    worker = Worker(concurrency=1)
    # A newer release's payload shape, maybe: handed back, no attempt spent, not due at once.
    assert worker.run_once() == 1
    row = job_row(job_id)
    assert (row["attempts"], row["locked_by"], count("dead_letters")) == (0, None, 0)
    assert "this worker cannot run it (invalid payload" in row["last_error"]
    assert seconds_until_run(job_id) > 5
    assert worker.report().unrunnable == 1
    past_the_unrunnable_window(job_id)
    worker = Worker(concurrency=1)  # (the first leaves it to the others for a while)
    assert worker.run_once() == 1
    assert count("jobs", "kind <> 'send_alert'") == 0  # only the alert the dead letter raised
    letter = DeadLetter.objects.get(job_id=job_id)
    assert (letter.cause, letter.error_category, letter.attempts) == ("poison", "poison", 1)
    assert "invalid payload" in letter.last_error
    # The full payload is kept, as it was, for the human who reads the dead letter.
    assert letter.payload == payload
    report = worker.report()
    assert (report.dead_lettered, report.retried) == (1, 0)


@pytest.mark.django_db
def test_a_task_path_that_cannot_be_imported_is_left_for_another_worker_then_dead_letters_as_poison():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.no_such_task"))
    Worker(concurrency=1).run_once()
    row = job_row(job_id)
    assert (row["attempts"], count("dead_letters")) == (0, 0)
    assert row["unrunnable_since"] is not None
    past_the_unrunnable_window(job_id)
    Worker(concurrency=1).run_once()
    letter = DeadLetter.objects.get(job_id=job_id)
    assert (letter.cause, letter.attempts) == ("poison", 1)
    assert "cannot be imported" in letter.last_error
    assert "no worker could run it for 900 s" in letter.last_error


@pytest.mark.django_db
def test_a_run_that_settles_clears_unrunnable_since():
    job_id = tasks.defer.enqueue("cleared-unrunnable", 0.0).id
    execute("UPDATE jobs SET unrunnable_since = now() - interval '1 minute' WHERE job_id = %s", [job_id])
    assert Worker(concurrency=1).run_once() == 1  # deferred: it ran here
    assert job_row(job_id)["unrunnable_since"] is None


@pytest.mark.django_db
def test_an_older_worker_never_claims_a_kind_it_has_no_handler_for():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    old = Worker(concurrency=1)
    old.kinds = [k for k in old.kinds if k != JobKind.TASK.value]  # a release before the kind existed
    assert old.run_once() == 0
    row = job_row(job_id)
    assert (row["attempts"], row["locked_by"], row["last_error"]) == (0, None, "")
    assert Worker(concurrency=1).run_once() == 1  # a release that has it runs it
    assert count("jobs", "kind = 'task'") == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task", "cause", "message"),
    [
        (tasks.fail_permanently, "permanent", "PermanentError: the far side refused refused for good"),
        (tasks.fail_with_configuration_error, "configuration", "ConfigurationError: credentials refused for refused"),
    ],
    ids=["permanent", "configuration"],
)
def test_a_permanent_or_configuration_error_dead_letters_with_zero_retries(task, cause, message):
    result = task.enqueue("refused")
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    letter = DeadLetter.objects.get(job_id=result.id)
    assert (letter.cause, letter.error_category, letter.attempts) == (cause, cause, 1)
    assert message in letter.last_error
    assert count("jobs", "kind <> 'send_alert'") == 0  # only the alert the dead letter raised
    assert worker.report().retried == 0


# --- deferrals -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_deferral_requeues_after_its_delay_without_spending_an_attempt():
    result = tasks.defer.enqueue("breaker", 45.0)
    worker = Worker(concurrency=1)
    for n in (1, 2, 3):
        assert worker.run_once() == 1
        row = job_row(result.id)
        assert (row["attempts"], row["deferrals"], row["locked_by"]) == (0, n, None)
        assert "breaker open for breaker" in row["last_error"]
        assert seconds_until_run(result.id) == pytest.approx(45, abs=0.5)
        make_due(result.id)
    assert worker.report().deferred == 3
    assert count("dead_letters") == 0


@pytest.mark.django_db
def test_a_deferral_at_the_ceiling_dead_letters():
    ceiling = registry.get("task").max_deferrals
    result = tasks.defer.enqueue("breaker")
    execute("UPDATE jobs SET deferrals = %s", [ceiling - 1])
    worker = Worker(concurrency=1)
    worker.run_once()
    assert job_row(result.id)["deferrals"] == ceiling  # the last deferral allowed
    make_due(result.id)
    worker.run_once()
    letter = DeadLetter.objects.get(job_id=result.id)
    assert (letter.cause, letter.error_category) == ("deferral_ceiling", "deferred")
    assert f"deferred {ceiling} times (ceiling {ceiling})" in letter.last_error
    assert (worker.report().deferred, worker.report().dead_lettered) == (1, 1)


# --- fencing: a late worker's answer matches nothing -----------------------------------------


@pytest.mark.django_db
def test_a_late_worker_whose_lease_was_reaped_matches_nothing_with_any_settle():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    (late,) = claim("worker-a", lease_seconds=30).jobs
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (1, 0)
    (current,) = claim("worker-b", lease_seconds=30).jobs
    assert current.id == late.id
    assert current.lease_token != late.lease_token
    assert current.attempts == 2

    # Every write guarded on A's token matches nothing...
    assert repository.finish_many([(late.id, late.lease_token)]) == set()
    assert (
        repository.reschedule(
            late.id, late.lease_token, delay=0, attempts="keep", add_deferral=False, error="x", durable=True
        )
        is False
    )
    assert repository.dead_letter(late.id, late.lease_token, cause="permanent", category="permanent", error="x") is None
    assert leases.release([(late.id, late.lease_token)], refund=True) == 0
    assert leases.heartbeat(late.id, late.lease_token, 30) is None
    # ...and B's lease is untouched by all of them.
    row = job_row(job_id)
    assert (row["locked_by"], row["lease_token"], row["attempts"]) == ("worker-b", current.lease_token, 2)
    assert count("dead_letters") == 0
    assert repository.finish_many([(current.id, current.lease_token)]) == {current.id}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("then", ["succeed", "fail", "permanent"])
def test_a_worker_that_lost_its_lease_mid_job_counts_the_job_lost_and_leaves_the_new_owner_alone(then):
    result = tasks.lose_lease.enqueue(then)
    worker = Worker(concurrency=1)
    assert worker.run_once() == 1
    report = worker.report()
    assert (report.lost, report.finished, report.retried, report.dead_lettered) == (1, 0, 0, 0)
    # The job is still live, held by whoever took it over, with nothing stamped over it.
    row = job_row(result.id)
    assert (row["locked_by"], row["attempts"], row["last_error"]) == ("thief", 1, "")
    assert count("dead_letters") == 0


# --- the reaper ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_reaper_dead_letters_a_job_whose_worker_died_running_only_it_on_its_last_attempt():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), max_attempts=1, correlation_id="c-1")
    claim("worker-a")
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (0, 1)
    assert count("jobs", "kind <> 'send_alert'") == 0  # only the alert the dead letter raised
    assert count("jobs", "kind = 'send_alert'") == 1
    letter = DeadLetter.objects.get(job_id=job_id)
    assert (letter.cause, letter.attempts, letter.max_attempts, letter.correlation_id) == (
        "crashed_worker",
        1,
        1,
        "c-1",
    )
    assert "its worker (worker-a) died running only this job" in letter.last_error


@pytest.mark.django_db
def test_a_job_whose_worker_died_running_only_it_goes_back_with_its_attempt_spent():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    claim("worker-a")
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (1, 0)
    freed = job_row(job_id)
    assert (freed["locked_by"], freed["lease_token"], freed["attempts"], freed["crashes"]) == (None, None, 1, 0)
    assert freed["last_error"] == "its worker (worker-a) died running only this job"
    assert seconds_until_run(job_id) <= 0  # claimable again at once


@pytest.mark.django_db
def test_jobs_whose_worker_died_holding_several_go_back_with_attempts_refunded_as_suspects():
    # Nobody can say which of the three killed worker-a: none of them pays an attempt for it.
    ids = [queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), tenant=t, max_attempts=1) for t in "abc"]
    live = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), tenant="d")
    claim("worker-a", batch=3)
    claim("worker-b", lease_seconds=30)
    expire_lease(ids[0])  # one expired lease says worker-a is dead: all it held is rescued
    assert Worker(concurrency=1).reap() == (3, 0)
    for job_id in ids:
        row = job_row(job_id)
        assert (row["locked_by"], row["attempts"], row["crashes"]) == (None, 0, 1)
        assert row["last_error"] == "its worker (worker-a) died holding 3 jobs; attempt refunded, runs alone next"
    assert job_row(live)["locked_by"] == "worker-b"  # a live worker's lease is left alone
    assert count("dead_letters") == 0
    assert Worker(concurrency=1).reap() == (0, 0)


@pytest.mark.django_db
def test_a_suspect_is_claimed_alone_and_a_second_crash_is_pinned_on_it():
    suspect = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), tenant="a", max_attempts=1)
    other = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), tenant="b", max_attempts=1)
    execute("UPDATE jobs SET crashes = 1 WHERE job_id = %s", [suspect])
    # The ordinary claim never hands out a suspect...
    assert [j.job_id for j in claim("worker-a", batch=5).jobs] == [other]
    # ...a worker with nothing running claims it alone, and its crash now spends its attempt.
    worker = Worker(worker_id="worker-s", concurrency=4)
    worker.check_suspects()
    claimed = worker._claim(4, alone=True)
    assert [j.job_id for j in claimed] == [suspect] and claimed[0].suspect
    assert worker._solo  # nothing else starts beside it
    expire_lease(suspect)
    assert worker.reap() == (0, 1)  # worker-a lives: its lease on the other job is left alone
    assert DeadLetter.objects.get(job_id=suspect).cause == "crashed_worker"


@pytest.mark.django_db
def test_a_suspect_that_settles_is_cleared():
    job_id = tasks.defer.enqueue("cleared", 0.0).id
    execute("UPDATE jobs SET crashes = 2 WHERE job_id = %s", [job_id])
    assert Worker(concurrency=1).run_once() == 1  # claimed alone, deferred
    assert job_row(job_id)["crashes"] == 0


# --- heartbeat -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_heartbeat_extends_the_lease_by_a_full_lease_from_now_and_fails_once_the_lease_was_taken():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    (job,) = claim("worker-a", lease_seconds=40).jobs
    assert job.lease_seconds == 40
    execute(
        "UPDATE jobs SET lease_expires_at = now() + interval '1 second', heartbeat_at = now() - interval '1 minute'"
    )
    ctx = claimed_context(job)
    ctx.heartbeat()
    # Measured by PostgreSQL: a full lease from the database's now.
    assert one(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8, heartbeat_at = now() FROM jobs WHERE job_id = %s",
        [str(job_id)],
    ) == (40.0, True)

    expire_lease(job_id)
    Worker(concurrency=1).reap()
    (taken,) = claim("worker-b", lease_seconds=60).jobs
    with pytest.raises(LeaseLost):
        ctx.heartbeat()
    assert scalar(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM jobs WHERE lease_token = %s",
        [taken.lease_token],
    ) == pytest.approx(60)


# --- one job at a time, each in its own transaction -----------------------------------------------


@pytest.mark.django_db
def test_run_once_on_an_empty_queue_claims_nothing_and_is_not_a_claim_failure():
    worker = Worker(concurrency=1)
    failures = REGISTRY.get_sample_value("vpay_jobs_claim_failures_total") or 0.0
    assert worker.run_once() == 0
    assert worker.dispatcher.claim_failures == 0
    assert (REGISTRY.get_sample_value("vpay_jobs_claim_failures_total") or 0.0) == failures
    assert worker.report().claimed == 0


def test_a_worker_refuses_impossible_settings():
    for kwargs in ({"concurrency": 0}, {"heartbeat_seconds": 0}, {"queues": ()}):
        with pytest.raises(ValueError):
            Worker(**kwargs)


@pytest.mark.django_db
def test_job_rows_hold_only_live_work_after_mixed_jobs(effects):
    ok = tasks.record.enqueue("mixed-ok").id
    bad = tasks.fail_permanently.enqueue("mixed-bad").id
    later = tasks.record.using(run_after=None).enqueue("mixed-later").id
    execute("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE job_id = %s", [later])
    worker = Worker(concurrency=1)
    assert [worker.run_once() for _ in range(2)] == [1, 1]
    assert {r[0] for r in rows("SELECT job_id::text FROM jobs WHERE kind <> 'send_alert'")} == {later}
    assert DeadLetter.objects.filter(job_id=uuid.UUID(bad)).count() == 1
    assert count("jobs", "kind = 'send_alert'") == 1  # the dead letter's alert
    assert count("processed_jobs", "job_id = %s", [ok]) == 1


@pytest.mark.django_db
def test_an_already_processed_job_id_is_skipped_and_the_next_one_runs(effects):
    done_before = tasks.record.using(priority=2).enqueue("seen").id
    fresh = tasks.record.using(priority=1).enqueue("fresh").id
    execute(
        "INSERT INTO processed_jobs (job_id, kind, subject, expires_at)"
        " VALUES (%s, 'task', 'tests.tasks.record', now() + interval '1 day')",
        [done_before],
    )
    before = REGISTRY.get_sample_value("vpay_jobs_duplicates_skipped_total", {"kind": "task"}) or 0.0
    worker = Worker(concurrency=1)
    assert [worker.run_once() for _ in range(2)] == [1, 1]
    assert effects() == [("fresh", "")]
    assert count("jobs") == 0
    assert count("processed_jobs", "job_id = %s", [fresh]) == 1
    assert worker.report().finished == 2
    assert REGISTRY.get_sample_value("vpay_jobs_duplicates_skipped_total", {"kind": "task"}) == before + 1


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_lease_is_taken_mid_run_is_lost_and_its_neighbours_are_not(effects):
    tasks.record.using(priority=3).enqueue("kept-1")
    taken = tasks.lose_lease.using(priority=2).enqueue("succeed").id
    tasks.record.using(priority=1).enqueue("kept-2")
    worker = Worker(concurrency=1)
    assert [worker.run_once() for _ in range(3)] == [1, 1, 1]
    assert effects("kept") == [("kept-1", ""), ("kept-2", "")]
    report = worker.report()
    assert (report.finished, report.lost) == (2, 1)
    assert rows("SELECT job_id::text, locked_by FROM jobs") == [(taken, "thief")]
    # The lost job's answer did not commit: no fence row claims it was processed.
    assert count("processed_jobs", "job_id = %s", [taken]) == 0


@pytest.mark.django_db(transaction=True)
def test_a_failed_fenced_body_loses_its_on_commit_callbacks(tmp_path):
    outside = tmp_path / "on-commit.txt"
    tasks.append_on_commit.using(priority=3).enqueue(str(outside), "kept-")
    failing = tasks.append_on_commit.using(priority=2).enqueue(str(outside), "LEAKED-", then_fail=True).id
    tasks.append_on_commit.using(priority=1).enqueue(str(outside), "kept")
    worker = Worker(concurrency=1)
    assert [worker.run_once() for _ in range(3)] == [1, 1, 1]
    assert outside.read_text() == "kept-kept"
    assert {r[0] for r in rows("SELECT job_id::text FROM jobs")} == {failing}


def test_a_loop_fenced_handler_may_not_insert_its_own_fence_row():
    from jobs.runner.context import JobContext

    job = leases.ClaimedJob(
        id=1,
        job_id=uuid.uuid4(),
        kind="task",
        queue="default",
        payload={},
        attempts=1,
        max_attempts=5,
        deferrals=0,
        lease_token=uuid.uuid4(),
        lease_seconds=60.0,
        tenant="",
        correlation_id="",
    )
    # A second fence row would make the loop see a duplicate and roll the effect back.
    with pytest.raises(RuntimeError, match="fenced by the loop"):
        JobContext(job, 10.0, loop_fenced=True).first_time()
    # The payload stays out of the repr (it is application data).
    assert "payload" not in repr(job)


@pytest.mark.django_db(transaction=True)  # the release closes its connection afterwards
def test_grace_expiry_finishes_acked_jobs_and_releases_the_rest_with_the_right_attempt_count():
    ids = [queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"), priority=i) for i in range(3)]
    worker = Worker(concurrency=3)
    done, started, unstarted = worker._claim(3, alone=False)  # ordered by priority
    assert [j.job_id for j in (done, started, unstarted)] == ids
    worker._running.pop(done.id)
    worker._completer.add(done)  # finished, its delete still buffered
    worker._running[started.id].ctx_holder.append(claimed_context(started))  # its handler still running
    drain.release_everything_held(worker)
    # The finished one is deleted; the running one and the one never started go back with
    # their attempt refunded (a shutdown is not their failure).
    assert count("jobs", "job_id = %s", [done.job_id]) == 0
    assert job_row(started.job_id)["attempts"] == 0
    assert job_row(started.job_id)["locked_by"] is None
    assert "grace elapsed" in job_row(started.job_id)["last_error"]
    assert (job_row(unstarted.job_id)["attempts"], job_row(unstarted.job_id)["locked_by"]) == (0, None)
    report = worker.report()
    assert (report.finished, report.released) == (1, 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("thread", ["vpay-listen", "vpay-maintain"])
def test_a_dying_helper_thread_stops_the_worker_as_a_dying_executor_does(monkeypatch, caplog, thread):
    """Without its listener a worker would only poll; without its maintenance thread its
    leases would lapse under running handlers. Either dying stops the worker (crashed, so
    runworker exits non-zero and a supervisor restarts it), never a worker running on half."""
    import threading

    def boom(*args, **kwargs):
        raise RuntimeError(f"{thread} bug")

    if thread == "vpay-listen":
        monkeypatch.setattr("jobs.runner.worker.listen", boom)
    else:
        monkeypatch.setattr("jobs.maintenance.thread.Maintenance.run", boom)
    worker = Worker(worker_id=f"w-{thread}", concurrency=2, idle_sleep=0.1, heartbeat_seconds=0.5)
    ran = threading.Thread(target=worker.run)
    ran.start()
    ran.join(timeout=20)
    assert not ran.is_alive(), "the worker ran on without its helper thread"
    assert worker.crashed
    died = [r for r in caplog.records if r.getMessage().startswith("a worker thread died")]
    assert [(r.thread_name, r.alert) for r in died] == [(thread, True)]


@pytest.mark.django_db
def test_a_worker_leaves_a_job_it_could_not_run_to_the_others_for_a_while():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.no_such_task"))
    older = Worker(concurrency=1)
    assert older.run_once() == 1  # handed back: it cannot run it
    make_due(job_id)
    # Polling in step with the job's delay, it would otherwise always be first to claim it.
    assert older.run_once() == 0
    newer = Worker(concurrency=1)
    assert newer.run_once() == 1  # (here it cannot run it either; a newer release would)


@pytest.mark.django_db(transaction=True)  # the drain closes its connection afterwards
def test_a_clean_exit_acknowledges_what_the_completer_never_flushed(monkeypatch):
    monkeypatch.setattr(drain, "COMPLETER_DRAIN_SECONDS", 0.1)
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    worker = Worker(concurrency=1)
    (done,) = worker._claim(1, alone=True)
    worker._running.pop(done.id)
    worker._completer.add(done)  # finished, but its completer thread died before flushing
    worker._stopping.set()
    assert drain.wait_and_drain(worker) is False
    # Acknowledged, not left leased for a reaper to take for a crash.
    assert count("jobs", "job_id = %s", [job_id]) == 0
    assert worker.report().finished == 1


@pytest.mark.django_db(transaction=True)  # the release closes its connection afterwards
def test_grace_expiry_spends_the_attempt_of_a_handler_already_past_its_timeout():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.noop"))
    worker = Worker(concurrency=1)
    (hung,) = worker._claim(1, alone=True)
    ctx = claimed_context(hung)
    ctx.started_monotonic -= ctx.timeout_seconds + 1  # a hung handler, past its timeout
    worker._running[hung.id].ctx_holder.append(ctx)
    drain.release_everything_held(worker)
    row = job_row(job_id)
    assert (row["attempts"], row["locked_by"]) == (1, None)  # spent: no free pass at every deploy
    assert "past its timeout" in row["last_error"]


@pytest.mark.django_db(transaction=True)
def test_no_executor_claims_before_every_executor_has_connected():
    import threading

    from django.db import connection

    worker = Worker(worker_id="w-ready", concurrency=2)

    def executor() -> threading.Thread:
        thread = threading.Thread(target=lambda: (worker.dispatcher.executor_ready(), connection.close()))
        thread.start()
        return thread

    first = executor()
    first.join(0.3)
    assert first.is_alive(), "an executor went on to claim while its sibling had not connected"
    second = executor()  # the second executor connects: both go on, well inside the 5 s bound
    for thread in (first, second):
        thread.join(2)
        assert not thread.is_alive()


@pytest.mark.django_db
def test_a_wake_for_one_handed_over_job_stirs_one_idle_executor_not_all():
    import threading
    import time

    worker = Worker(worker_id="w-wake", concurrency=3)
    woke: list[float] = []
    generation = worker.dispatcher._generation

    def idle_executor() -> None:
        worker.dispatcher._wait_for_work(generation, 3.0)
        woke.append(time.monotonic())

    idle = [threading.Thread(target=idle_executor) for _ in range(3)]
    for thread in idle:
        thread.start()
    time.sleep(0.2)  # all three waiting on the condition
    worker.dispatcher.wake(1)
    time.sleep(0.5)
    assert len(woke) == 1, "a wake for one job stirred more than one idle executor"
    worker.dispatcher.wake()  # a stop: every one of them
    for thread in idle:
        thread.join(2)
    assert len(woke) == 3
