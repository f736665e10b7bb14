"""jobs.adapters.postgres.pull_forward against the real database: a waiting job made due now, a running
one woken (its plain reschedule then due at once), a floor respected, and a pull-forward
that lands while a settle commits not lost."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from jobs.adapters import postgres as queue
from jobs.adapters.postgres import EnqueueError
from jobs.kinds import JobKind
from jobs.storage import repository
from tests.conftest import database_url, wait_for
from tests.queue_support import claim, scalar, seconds_until_run
from tests.test_webhook_fast_path import blocked_on_a_lock

pytestmark = pytest.mark.django_db


def test_pull_forward__makes_a_job_due_later_than_the_floor_due_now():
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep", delay=3600)
    assert queue.pull_forward("sweep", floor=60) is True
    assert seconds_until_run(job_id) == pytest.approx(0, abs=0.5)


@pytest.mark.parametrize("floor", [60, timedelta(minutes=1)])
def test_pull_forward__leaves_a_job_due_within_the_floor_alone(floor):
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep", delay=30)
    assert queue.pull_forward("sweep", floor=floor) is False
    assert seconds_until_run(job_id) == pytest.approx(30, abs=0.5)


def _reschedule_an_hour_out(job, *, wakeable: bool) -> None:
    """What the worker's settle writes for a handler that answered ``reschedule_in(3600)``
    (``wakeable``) or a deferral of an hour (not)."""
    assert repository.reschedule(
        job.id, job.lease_token, delay=3600, attempts="reset", add_deferral=False, error="", durable=False,
        wakeable=wakeable,
    )  # fmt: skip


@pytest.mark.parametrize("wakeable", [True, False], ids=["reschedule", "deferral"])
def test_pull_forward__wakes_a_leased_job_whose_plain_reschedule_then_makes_it_due_at_once(wakeable):
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep")
    (job,) = claim().jobs
    assert queue.pull_forward("sweep") is True  # running: woken
    assert scalar("SELECT count(*) FROM jobs WHERE locked_at IS NOT NULL") == 1  # still its worker's
    _reschedule_an_hour_out(job, wakeable=wakeable)
    assert seconds_until_run(job_id) == pytest.approx(0 if wakeable else 3600, abs=0.5)


def test_pull_forward__with_a_floor_never_wakes_a_leased_job():
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep")
    (job,) = claim().jobs
    assert queue.pull_forward("sweep", floor=10) is False
    _reschedule_an_hour_out(job, wakeable=True)
    assert seconds_until_run(job_id) == pytest.approx(3600, abs=0.5)


def test_pull_forward__of_a_job_unwoken_and_rescheduled_leaves_it_where_its_worker_put_it():
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep")
    (job,) = claim().jobs
    _reschedule_an_hour_out(job, wakeable=True)  # nobody woke it: the hour stands
    assert seconds_until_run(job_id) == pytest.approx(3600, abs=0.5)


@pytest.mark.django_db(transaction=True)
def test_pull_forward__landing_while_the_settle_commits_waits_for_it_and_moves_the_job():
    # The settle holds the row (its statement is running); the pull-forward must not judge
    # the leased version it saw and give up: it waits, and moves what the settle wrote.
    job_id = queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep")
    (job,) = claim().jobs
    settling = psycopg.connect(database_url(), autocommit=False)
    try:
        settling.execute(
            "UPDATE jobs SET run_at = now() + interval '1 hour', locked_by = NULL, lease_token = NULL,"
            " locked_at = NULL, lease_expires_at = NULL, heartbeat_at = NULL WHERE id = %s",
            [job.id],
        )
        pulled = {}

        def pull():
            try:
                pulled["moved"] = queue.pull_forward("sweep")
            finally:
                connection.close()

        puller = threading.Thread(target=pull)
        puller.start()
        wait_for(blocked_on_a_lock, timeout=10, message="the pull-forward to wait for the settle")
        settling.commit()
        puller.join(10)
    finally:
        settling.close()
    assert pulled == {"moved": True}
    assert seconds_until_run(job_id) == pytest.approx(0, abs=0.5)


def test_pull_forward__of_an_unknown_key_moves_nothing():
    queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep", delay=3600)
    assert queue.pull_forward("other") is False
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now()") == 0


def test_pull_forward__refuses_a_negative_floor():
    with pytest.raises(EnqueueError):
        queue.pull_forward("sweep", floor=-1)
