"""A delivery resent while the run that exhausted it is still finishing its job: the known
gap written in docs/ops-console.md ("Resend…"), shown here against the real database.

The run records the delivery exhausted (a commit of its own) and then finishes its job (the
completer's delete, by id and lease token). A resend between the two finds the job's name
taken, so its enqueue adds nothing, and the finish deletes the only job: the reopened delivery
waits for the backstop scan's next pass. Marked ``xfail(strict=True)``: the fix (a job woken
while it ran is run again by its finish, and the resend wakes it) turns this into a pass, which
fails the suite until the mark is removed."""

from __future__ import annotations

import uuid

import pytest

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


@pytest.mark.xfail(strict=True, reason="known gap: docs/ops-console.md, 'Resend…'")
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
