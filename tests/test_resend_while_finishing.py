"""A delivery resent while the run that exhausted it is still finishing keeps a job.

The run records the delivery exhausted (a commit of its own) and then finishes its job (the
completer's delete, by id and lease token). A resend landing between the two used to find
the job's name taken, enqueue nothing, and leave the reopened delivery to the backstop scan's
next pass, a minute later (seen as a timed-out live test under a loaded full run). The
resend now takes the name from the finishing run (``jobs.port.release_running_name``)."""

from __future__ import annotations

import uuid

import pytest

from jobs.adapters.postgres import release_running_name
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
        "UPDATE jobs SET locked_by = 'w', lease_token = %s, locked_at = now(), lease_expires_at = now() + interval '30 s',"
        " attempts = attempts + 1 WHERE dedupe_key = %s RETURNING id",
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


def test_a_waiting_job_keeps_its_name_and_is_the_one_the_resend_finds():
    delivery = DeliveryFactory()  # its deliver job waits, due
    assert not release_running_name(dedupe_key(delivery.pk))
    assert rows("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]) == [(1,)]
