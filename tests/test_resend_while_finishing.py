"""A delivery sent again (resent, or its endpoint re-enabled) while the run that ended it
still has its job, against the real database.

The run records the delivery exhausted (a commit of its own) and then finishes its job (the
completer's delete, by id and lease token); a delivery carried in another's batch has its job
held until the batch settles it (``settle_held``, by name and hold). A resend between the two
finds the job's name taken, so its enqueue adds nothing. It wakes the job instead
(``pull_forward``): a leased one's finish then runs it again (jobs.storage.repository's
_FINISH_MANY), and a held one, moved, is no longer the batch's to settle. Without the wake the
reopened delivery waited for the backstop scan's next pass, a minute."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from jobs import port
from jobs.storage import repository as jobs_repository
from tests.factories.webhooks import DeliveryFactory
from tests.queue_support import execute, one, rows
from webhooks.services.delivery import dedupe_key
from webhooks.services.endpoint_health import endpoint_disable, endpoint_enable
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


def finishing_on_its_own_connection(job_id: int, token: uuid.UUID, finished: list):
    """The old run's finish (the completer's delete) as a thread's target, on a connection of
    its own; ``finished`` receives what it matched."""

    def the_old_runs_finish():
        try:
            finished.append(jobs_repository.finish_many([(job_id, token)]))
        finally:
            connection.close()

    return the_old_runs_finish


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
    the_old_runs_finish = finishing_on_its_own_connection(job_id, token, finished)

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


def test_a_delivery_resent_after_its_batchs_hold_ran_out_keeps_the_job_the_batch_then_settles():
    """The hold ran out and no claim took the job yet: due, still carrying the hold's run_at.
    The resend moves it (a wake that finds a due job makes it due again, now), so the
    carrier's late settle finds it moved and leaves it."""
    delivery = DeliveryFactory()
    name = dedupe_key(delivery.pk)
    held = port.hold_waiting([name], 0.05)
    assert held.names == [name]
    time.sleep(0.2)
    execute("UPDATE webhook_deliveries SET state = 'exhausted', completed_at = now() WHERE id = %s", [delivery.pk])

    assert resend_delivery(delivery.pk, reason="the receiver is fixed")
    assert port.settle_held([(name, None)], held) == 0

    assert rows("SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [name]) == [(True, True)]


def test_an_endpoint_re_enabled_while_a_run_that_found_it_disabled_finishes_keeps_its_deliveries_job():
    delivery = DeliveryFactory()
    name = dedupe_key(delivery.pk)
    endpoint_id = one("SELECT endpoint_id FROM webhook_deliveries WHERE id = %s", [delivery.pk])[0]
    assert endpoint_disable(endpoint_id=endpoint_id, reason="the receiver is down", actor="ops")
    job_id, token = the_run_that_exhausted_it(delivery.pk)  # leased, as a run that found it disabled
    execute("UPDATE webhook_deliveries SET state = 'pending', completed_at = NULL WHERE id = %s", [delivery.pk])

    with transaction.atomic():
        assert endpoint_enable(endpoint_id=endpoint_id, actor="ops") == 1
        assert jobs_repository.finish_many([(job_id, token)]) == {job_id}  # that run's finish, before the commit

    assert rows("SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [name]) == [(True, True)]


def test_the_wake_goes_before_the_enqueue_so_a_finish_between_them_waits_and_sees_it(monkeypatch):
    """enqueue_or_wake's order: the old run's finish lands after the first of its two steps.
    Woken first, the job's row is locked until the resend commits, so that finish waits and
    runs it again; enqueued first (the name taken: nothing added, nothing locked), the finish
    would delete the job and the wake would find nothing."""
    delivery = DeliveryFactory()
    job_id, token = the_run_that_exhausted_it(delivery.pk)
    adapter = port.adapter()
    finished: list = []
    the_old_runs_finish = finishing_on_its_own_connection(job_id, token, finished)

    def then_the_finish(step):
        def first_step_then_the_finish(*args, **kwargs):
            result = step(*args, **kwargs)
            if not finish.is_alive() and not finished:
                finish.start()
                finish.join(timeout=0.5)
            return result

        return first_step_then_the_finish

    finish = threading.Thread(target=the_old_runs_finish)
    monkeypatch.setattr(adapter, "run_again", then_the_finish(adapter.run_again))
    monkeypatch.setattr(adapter, "enqueue", then_the_finish(adapter.enqueue))
    assert resend_delivery(delivery.pk, reason="the receiver is fixed")
    finish.join(timeout=10)

    assert finished == [{job_id}]
    assert rows(
        "SELECT locked_at IS NULL, run_at <= now() FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]
    ) == [(True, True)]
