"""The runner's execution model against real worker processes: capacity (claim only what
an executor starts now), crash attribution, liveness under the worker heartbeat, hand-back
after a lost database, and singletons that come back.

Speed is measured in bench/; these tests check orderings and counts, with bounds loose
enough for a loaded CI machine and far from what the old batch model produced.
"""

from __future__ import annotations

import signal
import time

import pytest

from jobs import registry
from jobs.adapters import postgres as queue
from jobs.adapters.postgres import JobRequest
from tests.conftest import wait_for
from tests.queue_support import scalar, task_payload
from tests.test_worker_process import log_records, logged, wait_exit, wait_started

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def effect_rows(prefix: str) -> list[tuple[str, float]]:
    """(label, insert time as epoch seconds on the database clock), in insert order."""
    from tests.charges_support import sql

    return sql(
        "SELECT label, extract(epoch FROM at)::float8 FROM test_effects WHERE label LIKE %s ORDER BY id", [prefix + "%"]
    )


def test_slow_jobs_start_together_and_fast_jobs_run_beside_them(effects, start_worker):
    # 4 jobs of 1.5 s, then 200 instant ones, for 8 executors. The old batch model started
    # the slow ones seconds apart and held fast ones behind them while slots sat idle.
    queue.enqueue_many(
        JobRequest("task", task_payload("tests.tasks.record_then_sleep", f"slow-{i}", 1.5)) for i in range(4)
    )
    queue.enqueue_many(JobRequest("task", task_payload("tests.tasks.record", f"fast-{i}")) for i in range(200))
    worker = start_worker("--concurrency", "8")
    wait_for(lambda: len(effect_rows("slow-")) == 4 and len(effect_rows("fast-")) == 200, 60, message="all jobs ran")
    slow_starts = [at for _, at in effect_rows("slow-")]
    fast = [at for _, at in effect_rows("fast-")]
    assert max(slow_starts) - min(slow_starts) < 0.5, slow_starts
    # Every fast job ran while the slow ones were still running.
    assert max(fast) < min(slow_starts) + 1.5, max(fast) - min(slow_starts)
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, 30) == 0


def test_a_job_that_kills_its_worker_spends_only_its_own_attempts(effects, start_worker):
    killer = queue.enqueue(queue.JobKind.TASK, task_payload("tests.tasks.kill_the_process"), max_attempts=3)
    queue.enqueue_many(
        JobRequest("task", task_payload("tests.tasks.record_slowly", f"beside-{i}", 0.3), max_attempts=1)
        for i in range(30)
    )
    singletons = len([spec for spec in registry.all_specs() if spec.singleton is not None])

    def buried() -> bool:
        return bool(scalar("SELECT count(*) FROM dead_letters WHERE job_id = %s", [killer]))

    restarts = 0
    while not buried():
        # A supervisor's restart loop: the killer takes each worker down until it is buried.
        assert restarts < 12, "the killer was never dead-lettered"
        restarts += 1
        worker = start_worker("--concurrency", "4", "--heartbeat", "0.5")
        wait_for(lambda w=worker: w.proc.poll() is not None or buried(), 60, message="the worker to die")
        if worker.proc.poll() is None:  # the last one buried the killer and lives on
            worker.signal(signal.SIGTERM)
            assert wait_exit(worker, 30) == 0
        else:
            assert worker.proc.returncode == -signal.SIGKILL, worker.output()[-2000:]
    letters = scalar("SELECT json_agg(json_build_array(job_id, cause, attempts)) FROM dead_letters")
    assert letters == [[str(killer), "crashed_worker", 3]], letters
    # The rest ran: each neighbour exactly once, with its single attempt intact.
    finisher = start_worker("--concurrency", "4", "--heartbeat", "0.5", "--burst")
    assert wait_exit(finisher, 60) == 0, finisher.output()[-3000:]
    assert sorted(label for label, _ in effects("beside-")) == sorted(f"beside-{i}" for i in range(30))
    assert scalar("SELECT count(*) FROM dead_letters") == 1
    # The housekeeping singletons are all alive: none was spent on the killer's crashes.
    assert scalar("SELECT count(*) FROM jobs WHERE dedupe_key LIKE 'singleton:%%'") == singletons


def test_a_running_handlers_lease_never_lapses_while_its_worker_lives(effects, start_worker):
    # A 4 s handler under a 3 s lease (heartbeat 0.5 s), and a second worker reaping every
    # half second: the first worker's heartbeat keeps the lease, so nothing runs it twice.
    queue.enqueue(queue.JobKind.TASK, task_payload("tests.tasks.record_slowly", "long", 4.0))
    runner = start_worker("--concurrency", "1", "--heartbeat", "0.5")
    wait_started(runner)
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE locked_at IS NOT NULL AND kind = 'task'"), 15)
    reaper = start_worker("--concurrency", "1", "--heartbeat", "0.5", "--queues", "idle")
    wait_for(lambda: effects("long"), 20, message="the long job to finish")
    time.sleep(1.0)
    for worker in (runner, reaper):
        worker.signal(signal.SIGTERM)
        assert wait_exit(worker, 30) == 0
    assert effects("long") == [("long", "")]
    assert not logged(reaper, "rescued the jobs of a dead worker")
    assert "lost=0" in runner.output()


def test_a_dead_workers_jobs_are_rescued_about_two_heartbeats_after_it_died(effects, start_worker):
    # A task's own timeout (and so its old lease) is minutes; the worker's lease is 3 s.
    job_id = queue.enqueue(queue.JobKind.TASK, task_payload("tests.tasks.record_slowly", "rescued", 60.0))
    doomed = start_worker("--concurrency", "1", "--heartbeat", "0.5", "--worker-id", "doomed")
    wait_for(lambda: scalar("SELECT locked_by FROM jobs WHERE job_id = %s", [job_id]) == "doomed", 20)
    rescuer = start_worker("--concurrency", "1", "--heartbeat", "0.5", "--queues", "idle")
    wait_started(rescuer)
    doomed.kill()
    killed_at = time.monotonic()
    wait_for(lambda: scalar("SELECT locked_by FROM jobs WHERE job_id = %s", [job_id]) is None, 30, interval=0.02)
    assert time.monotonic() - killed_at < 8.0  # the lease (3 s) plus a reap period, with room for a slow CI
    wait_for(lambda: logged(rescuer, "rescued the jobs of a dead worker"), 5, message="the rescue's log line")


def test_a_worker_that_loses_its_database_hands_back_what_it_held_at_once(effects, start_worker):
    job_id = queue.enqueue(queue.JobKind.TASK, task_payload("tests.tasks.record_slowly", "outage", 1.5))
    worker = start_worker("--concurrency", "2", "--heartbeat", "0.5", "--worker-id", "cut-off")
    wait_for(lambda: scalar("SELECT locked_by FROM jobs WHERE job_id = %s", [job_id]) == "cut-off", 20)
    # Every connection of the worker is cut while the handler sleeps.
    scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s",
        ["vpay-%:cut-off%"],
    )
    cut_at = time.monotonic()
    wait_for(lambda: effects("outage"), 20, message="the job to run again")
    # Handed back, not failed: no retry (whose backoff could be 30 s), no lease expiry.
    assert time.monotonic() - cut_at < 20.0
    assert effects("outage") == [("outage", "")]
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    messages = [r["message"] for r in log_records(worker)]
    assert "the database went away under the handler; handing the job back" in messages
    assert "job failed; retrying" not in messages
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, 30) == 0
    assert "retried=0" in worker.output()


def test_a_missing_singleton_is_seeded_again_by_a_running_worker(start_worker):
    worker = start_worker("--concurrency", "1", "--heartbeat", "0.5")
    wait_started(worker)
    key = "singleton:webhook_fan_out"
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [key]) == 1, 10)
    # Gone, as if dead-lettered or cancelled: the outbox drain must not wait for a restart.
    scalar("WITH gone AS (DELETE FROM jobs WHERE dedupe_key = %s RETURNING 1) SELECT count(*) FROM gone", [key])
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [key]) == 1, 10, message="re-seeded")
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, 30) == 0
