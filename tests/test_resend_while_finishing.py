"""A delivery resent while the run that ended it still has its job, against the real database.

The run records the delivery exhausted (a commit of its own) and then finishes its job (the
completer's delete, by id and lease token); a delivery carried in another's batch has its job
held until the batch settles it (``settle_held``, by name and hold). A resend between the two
finds the job's name taken, so its enqueue adds nothing. It wakes the job instead
(``pull_forward``): a leased one's finish then runs it again (jobs.storage.repository's
_FINISH_MANY), and a held one, moved, is no longer the batch's to settle. Without the wake the
reopened delivery waited for the backstop scan's next pass, a minute."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, transaction

from jobs import port
from jobs.storage import repository as jobs_repository
from tests.factories.webhooks import DeliveryFactory
from tests.queue_support import execute, one, rows
from webhooks.services.delivery import dedupe_key
from webhooks.services.resend import resend_delivery

pytestmark = pytest.mark.django_db(transaction=True)


def the_run_that_exhausted_it(delivery_id: int) -> tuple[int, uuid.UUID]:
    """The delivery exhausted and its job leased, as a run that recorded the last attempt and
    has not yet finished its job leaves them."""
    token = uuid.uuid4()
    execute("UPDATE webhook_deliveries SET state = 'exhausted', completed_at = now() WHERE id = %s", [delivery_id])
    (job_id,) = one(
        "UPDATE jobs SET locked_by = 'w', lease_token = %s, locked_at = now(),"
        " lease_expires_at = now() + interval '30 s', attempts = attempts + 1 WHERE dedupe_key = %s RETURNING id",
        [token, dedupe_key(delivery_id)],
    )
    return job_id, token


def test_a_delivery_resent_before_the_exhausting_run_finishes_its_job_has_a_job_due_after_that_finish():
    delivery = DeliveryFactory()
    job_id, token = the_run_that_exhausted_it(delivery.pk)

    assert resend_delivery(delivery.pk, reason="the receiver is fixed")
    assert jobs_repository.finish_many([(job_id, token)]) == {job_id}  # the old run's finish, after the resend

    assert rows(
        "SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]
    ) == [(True, True)]


def test_a_delivery_resent_after_the_exhausting_run_finished_has_its_job_due_at_once():
    """The side of the gap that holds: once the old job is gone, the resend's enqueue makes one."""
    delivery = DeliveryFactory()
    job_id, token = the_run_that_exhausted_it(delivery.pk)
    assert jobs_repository.finish_many([(job_id, token)]) == {job_id}

    assert resend_delivery(delivery.pk, reason="the receiver is fixed")

    assert rows(
        "SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]
    ) == [(True, True)]


def test_a_delivery_resent_while_a_batch_holds_its_job_keeps_the_job_the_batch_then_settles():
    delivery = DeliveryFactory()
    name = dedupe_key(delivery.pk)
    held = port.hold_waiting([name], 60)  # a carrier took it into its batch
    assert held.names == [name]
    execute("UPDATE webhook_deliveries SET state = 'exhausted', completed_at = now() WHERE id = %s", [delivery.pk])

    assert resend_delivery(delivery.pk, reason="the receiver is fixed")
    assert port.settle_held([(name, None)], held) == 0  # the batch's settle: moved since, not its own

    assert rows("SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [name]) == [(True, True)]


def test_a_resend_that_commits_while_the_finish_waits_for_the_job_row_is_seen_by_that_finish():
    """The finish decides on the row it deletes: one blocked behind the resend's lock reads the
    wake once the resend commits (READ COMMITTED's recheck), not its statement's older view."""
    delivery = DeliveryFactory()
    job_id, token = the_run_that_exhausted_it(delivery.pk)
    finished: list = []

    def the_old_runs_finish():
        try:
            finished.append(jobs_repository.finish_many([(job_id, token)]))
        finally:
            connection.close()

    with transaction.atomic():
        assert resend_delivery(delivery.pk, reason="the receiver is fixed")  # its row lock held to the commit
        finish = threading.Thread(target=the_old_runs_finish)
        finish.start()
        finish.join(timeout=0.5)
        assert finish.is_alive(), "the finish should wait for the resend's row lock"
    finish.join(timeout=10)

    assert finished == [{job_id}]
    assert rows(
        "SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]
    ) == [(True, True)]
