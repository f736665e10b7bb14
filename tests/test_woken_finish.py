"""A job woken while it ran (``pull_forward`` on a leased job) is run again by its finish:
jobs.storage.repository's _FINISH_MANY, against the real database. The port's side, on both
adapters, is in tests/test_queue_port.py."""

from __future__ import annotations

import json

import pytest

from jobs import port
from jobs.runner.report import Report
from jobs.runner.settling import Settler
from jobs.storage import repository
from tests.queue_support import claim, execute, one, rows, task_payload

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "woken:one"


def a_leased_job(*, woken: bool):
    port.enqueue("task", task_payload(), dedupe_key=NAME, tenant="t1", correlation_id="c-1", priority=3)
    (job,) = claim().jobs
    if woken:
        assert port.pull_forward(NAME)
    return job


def live() -> list[tuple]:
    return rows(
        "SELECT job_id, kind, payload = %s::jsonb, tenant, correlation_id, priority, attempts, locked_at IS NULL,"
        " run_at <= now() FROM jobs WHERE dedupe_key = %s",
        [json.dumps(task_payload()), NAME],
    )


def test_a_woken_job_finished_is_due_again_at_once_with_its_identity_and_no_attempt_spent():
    job = a_leased_job(woken=True)
    woken: set[int] = set()

    assert repository.finish_many([(job.id, job.lease_token)], woken=woken) == {job.id}

    assert woken == {job.id}
    assert live() == [(job.job_id, "task", True, "t1", "c-1", 3, 0, True, True)]


def test_a_job_not_woken_is_deleted_by_its_finish():
    job = a_leased_job(woken=False)
    woken: set[int] = set()

    assert repository.finish_many([(job.id, job.lease_token)], woken=woken) == {job.id}

    assert woken == set()
    assert live() == []


def test_a_woken_job_of_a_kind_whose_job_id_is_spent_once_is_deleted():
    job = a_leased_job(woken=True)

    assert repository.finish_many([(job.id, job.lease_token)], once=[job.id]) == {job.id}

    assert live() == []


def test_a_woken_job_whose_cancel_was_asked_for_is_deleted_the_cancel_wins():
    job = a_leased_job(woken=True)
    execute(
        "UPDATE jobs SET cancel_requested_at = now(), cancel_requested_by = 'ops', cancel_reason = 'wrong merchant' WHERE id = %s",
        [job.id],
    )
    overtaken: list = []

    assert repository.finish_many([(job.id, job.lease_token)], overtaken) == {job.id}

    assert overtaken == [(job.id, "ops", "wrong merchant")]
    assert live() == []


def test_a_woken_job_whose_lease_was_lost_is_left_to_whoever_holds_it():
    job = a_leased_job(woken=True)
    execute("UPDATE jobs SET lease_token = gen_random_uuid() WHERE id = %s", [job.id])

    assert repository.finish_many([(job.id, job.lease_token)]) == set()

    assert one("SELECT count(*) FROM jobs WHERE dedupe_key = %s AND locked_at IS NOT NULL", [NAME]) == (1,)


def test_the_completer_runs_again_a_woken_job_of_an_unfenced_kind_not_one_of_a_fenced_kind():
    """Settler.finish says which kinds are spent once: the fenced task kind (a handler that
    wrote nothing, acknowledged with its fence in the completer's batch) against a poll."""
    port.enqueue("task", task_payload(), dedupe_key=NAME)
    port.enqueue("poll_charge", {"charge_id": "ch_1"}, dedupe_key="woken:poll")
    jobs = claim(batch=2).jobs
    assert port.pull_forward(NAME) and port.pull_forward("woken:poll")
    fenced = next(j for j in jobs if j.kind == "task")

    Settler(Report()).finish(jobs, fences={fenced.id: "tests.tasks.noop"})

    assert rows("SELECT dedupe_key, locked_at IS NULL FROM jobs ORDER BY id") == [("woken:poll", True)]


def test_a_wake_of_a_job_already_due_keeps_its_place_among_its_tenants_due_jobs():
    """enqueue_or_wake on an overdue job moves its run_at (a carrier's stale hold then leaves it)
    by a microsecond, earlier: not to now, behind every job that came due since."""
    for name in ("woken:old", "woken:b", "woken:c"):
        port.enqueue("task", task_payload(), dedupe_key=name, tenant="m1")
    for name, minutes in (("woken:old", 10), ("woken:b", 5), ("woken:c", 4)):
        execute("UPDATE jobs SET run_at = now() - make_interval(mins => %s) WHERE dedupe_key = %s", [minutes, name])

    port.enqueue_or_wake("task", task_payload(), dedupe_key="woken:old", tenant="m1")

    names = dict(rows("SELECT id, dedupe_key FROM jobs"))
    assert [names[claim().jobs[0].id] for _ in range(3)] == ["woken:old", "woken:b", "woken:c"]
