"""Parked jobs (jobs.storage.parking): a job due beyond the horizon is out of the claim's index
until the maintenance thread unparks it, whatever wrote its run_at; and the claim steps over
none of a tenant's far-off jobs."""

from __future__ import annotations

import json

import pytest

from jobs.adapters import postgres as queue
from jobs.adapters.postgres import JobRequest
from jobs.storage import leases, parking, pull_forward_sql, repository
from tests.conftest import wait_for
from tests.queue_support import claim, claim_statement_params, count, execute, rows, scalar, task_payload

H = parking.HORIZON_SECONDS
NOOP = task_payload("tests.tasks.noop")


def parked(job_id) -> bool:
    return scalar("SELECT parked FROM jobs WHERE job_id = %s", [str(job_id)])


@pytest.mark.django_db
def test_the_trigger_parks_exactly_what_is_due_beyond_the_horizon_the_code_uses():
    near = queue.enqueue("task", NOOP, delay=H - 2)
    far = queue.enqueue("task", NOOP, delay=H + 2)
    now = queue.enqueue("task", NOOP)
    assert (parked(near), parked(far), parked(now)) == (False, True, False)
    # The ORM and an operator's SQL go through it as well.
    execute("UPDATE jobs SET run_at = now() + make_interval(secs => %s) WHERE job_id = %s", [H + 60, str(now)])
    assert parked(now)
    execute("UPDATE jobs SET run_at = now() WHERE job_id = %s", [str(far)])
    assert not parked(far)


@pytest.mark.django_db
def test_every_queue_write_of_run_at_parks_or_unparks():
    job_id = queue.enqueue("task", NOOP)
    job = claim().jobs[0]
    assert repository.reschedule(
        job.id, job.lease_token, delay=3600, attempts="keep", add_deferral=False, error="", durable=False
    )
    assert parked(job_id), "a retry an hour out is parked"
    execute("UPDATE jobs SET dedupe_key = 'named' WHERE job_id = %s", [str(job_id)])
    assert pull_forward_sql.pull_forward("named", 0)
    assert not parked(job_id), "pulled forward to now: back in the claim's index"


@pytest.mark.django_db
def test_the_claim_never_takes_a_parked_job_and_takes_it_once_unparked():
    job_id = queue.enqueue("task", NOOP)
    # Parked and overdue: what a table looks like when no maintenance ran for a while.
    execute("UPDATE jobs SET parked = true WHERE job_id = %s", [str(job_id)])
    assert claim(batch=16).jobs == []
    assert parking.unpark_due() == 1
    assert [j.job_id for j in claim(batch=16).jobs] == [job_id]


@pytest.mark.django_db
def test_unparking_leaves_what_is_due_beyond_the_horizon():
    queue.enqueue_many([JobRequest("task", NOOP, delay=H + 30) for _ in range(3)])
    soon = queue.enqueue("task", NOOP, delay=H + 30)
    # Due within the horizon now, as if written 31 seconds ago (run_at alone moved: the
    # trigger would unpark it itself).
    execute("ALTER TABLE jobs DISABLE TRIGGER jobs_job_park")
    execute("UPDATE jobs SET run_at = now() + interval '1 second' WHERE job_id = %s", [str(soon)])
    execute("ALTER TABLE jobs ENABLE TRIGGER jobs_job_park")
    assert parked(soon)
    assert parking.unpark_due() == 1
    assert count("jobs", "parked") == 3 and not parked(soon)


@pytest.mark.django_db
def test_a_claim_steps_over_none_of_a_tenants_far_off_jobs():
    # 20,000 jobs scheduled over the next two weeks and one due now, one tenant: the claim
    # for 16 executors finds one job; without parking its scan read every far-off entry.
    execute(
        "INSERT INTO jobs (kind, payload, run_at) SELECT 'task', %s, now() + make_interval(mins => i) "
        "FROM generate_series(1, 20000) i",
        [json.dumps(NOOP)],
    )
    queue.enqueue("task", NOOP)
    execute("ANALYZE jobs")
    params = claim_statement_params(batch=16)
    execute("SET LOCAL jit = off")
    plan = rows("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + leases.CLAIM, params)[0][0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    buffers = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
    # 25 with parking (the walk, one lock, one update); 1,973 without (measured).
    assert buffers < 80, buffers


def park_overdue(label: str):
    """A job parked and already past its run_at: what the table holds when no worker ran
    while it came due (the trigger disabled for the write, or it would unpark it)."""
    job_id = queue.enqueue("task", task_payload("tests.tasks.record", label), delay=3600)
    assert parked(job_id)
    execute("ALTER TABLE jobs DISABLE TRIGGER jobs_job_park")
    execute("UPDATE jobs SET run_at = now() - interval '1 second' WHERE job_id = %s", [str(job_id)])
    execute("ALTER TABLE jobs ENABLE TRIGGER jobs_job_park")
    assert parked(job_id)
    return job_id


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_unparks_an_overdue_parked_job_and_runs_it(effects, start_worker):
    start_worker("--concurrency", "1")
    queue.enqueue("task", task_payload("tests.tasks.record", "warm"))
    wait_for(lambda: effects("warm"), timeout=30, message="the worker to run a first job")
    park_overdue("parked")  # after its boot: only the maintenance thread can unpark it
    wait_for(lambda: effects("parked"), timeout=15, message="the parked job to be unparked and run")


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_started_after_no_worker_ran_runs_what_came_due_before_it_exits(effects, start_worker):
    park_overdue("burst")
    worker = start_worker("--burst", "--concurrency", "1")
    assert worker.wait(timeout=60) == 0, worker.output()[-2000:]
    assert effects("burst")
