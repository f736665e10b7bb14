"""Work that becomes due by a hand-back or a rescue wakes the idle workers of its queue, as an
enqueue does: a NOTIFY on ``vpay_jobs`` at commit, so it never waits out an idle poll."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance.thread import reap
from jobs.storage import leases, repository
from tests.conftest import database_url
from tests.queue_support import claim, expire_lease, task_payload


def wakes_during(action) -> list[str]:
    """The queues named by the NOTIFYs on vpay_jobs while ``action`` runs and commits."""
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN vpay_jobs")
        action()
        return [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]


@pytest.mark.django_db(transaction=True)
def test_a_hand_back_wakes_the_idle_workers_of_its_queue():
    queue.enqueue(JobKind.TASK, task_payload(), queue="batch")
    (job,) = claim("worker-a", queues=["batch"]).jobs
    connection.close()
    assert wakes_during(lambda: leases.release([(job.id, job.lease_token)], refund=True)) == ["batch"]


@pytest.mark.django_db(transaction=True)
def test_a_rescue_wakes_the_idle_workers_of_its_queue():
    job_id = queue.enqueue(JobKind.TASK, task_payload(), queue="batch")
    claim("ghost", queues=["batch"])
    expire_lease(job_id)
    connection.close()
    assert wakes_during(lambda: reap()) == ["batch"]


@pytest.mark.django_db(transaction=True)
def test_a_job_woken_while_it_ran_and_due_again_at_its_finish_wakes_the_idle_workers_of_its_queue():
    queue.enqueue(JobKind.TASK, task_payload(), queue="batch", dedupe_key="woken:wakes")
    (job,) = claim("worker-a", queues=["batch"]).jobs
    assert queue.pull_forward("woken:wakes")
    connection.close()
    assert wakes_during(lambda: repository.finish_many([(job.id, job.lease_token)])) == ["batch"]
