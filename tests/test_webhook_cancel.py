"""An operator's cancel of a ``webhook_deliver`` job sticks: its delivery ends ``cancelled``
(no alert, nothing more sent), so neither the backstop's re-enqueue nor its lease recovery
sends it again. Real PostgreSQL, a real receiver process, the real cancel service, worker
and backstop scan."""

from __future__ import annotations

import ipaddress

import pytest
from django.db import transaction

from jobs.models import Alert, DeadLetter
from jobs.runner.worker import Worker
from jobs.services import cancels
from merchants.services import create_merchant
from tests.queue_support import claim, expire_lease, scalar
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import AttemptState, DeliveryAttempt, DeliveryState, WebhookDelivery
from webhooks.repository import CANCELLED_BY_OPERATOR
from webhooks.services import delivery, endpoints, fanout, scan

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0


def one_delivery(receiver, path: str) -> WebhookDelivery:
    """A merchant, an endpoint at ``path``, one event fanned out: its delivery and waiting job."""
    m = create_merchant("Acme")[0]
    endpoints.create_endpoint(m, url=receiver.url(path), enabled_events=["*"])
    with transaction.atomic():
        emit(m, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent", "amount": 100})
    fanout.drain_once()
    return WebhookDelivery.objects.get()


def deliver_job_id(d: WebhookDelivery):
    return scalar("SELECT job_id FROM jobs WHERE dedupe_key = %s", [delivery.dedupe_key(d.pk)])


def cancel(job_id) -> cancels.Cancelled:
    return cancels.job_cancel(job_id=job_id, actor="olga", reason="merchant asked us to stop")


def sticks(d: WebhookDelivery) -> WebhookDelivery:
    """The delivery ended cancelled and the backstop leaves it so."""
    result = scan.scan_once(overdue_seconds=0)
    assert (result.requeued, result.recovered, result.exhausted) == (0, 0, 0)
    d.refresh_from_db()
    assert (d.state, d.cancel_reason) == (DeliveryState.CANCELLED, CANCELLED_BY_OPERATOR)
    assert d.completed_at is not None and d.lease_token is None
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'webhook_deliver'") == 0
    assert not Alert.objects.exists()  # the operator who cancelled is the human who knows
    return d


def test_a_cancelled_waiting_deliver_job_ends_its_delivery_cancelled_and_the_backstop_does_not_resend_it(receiver):
    d = one_delivery(receiver, "/hooks/a")
    job_id = deliver_job_id(d)
    letter_id = cancel(job_id).dead_letter_id
    sticks(d)
    # Who and why are on the job's dead letter (internal); the merchant sees the fixed reason.
    letter = DeadLetter.objects.get(pk=letter_id)
    assert (letter.cause, letter.discarded_by, letter.discard_reason) == (
        "cancelled",
        "olga",
        "merchant asked us to stop",
    )
    assert receiver.received() == []


@pytest.mark.django_db(transaction=True)
def test_a_deliver_job_cancelled_while_it_runs_ends_its_delivery_cancelled_at_the_next_rung(receiver):
    d = one_delivery(receiver, "/hooks/b?mode=status&status=500")
    worker = Worker(worker_id="w-deliver", concurrency=1)
    worker.heartbeat()  # a live worker: the cancel is a request
    (job,) = claim(worker.worker_id, batch=1).jobs
    assert not cancel(job.job_id).ended
    worker.run_claimed(job)  # one attempt (500); its next rung is refused by the request
    d = sticks(d)
    assert d.attempts == 1 and len(receiver.received()) == 1


def test_a_deliver_job_whose_worker_died_mid_attempt_is_cancelled_with_its_delivery(receiver):
    d = one_delivery(receiver, "/hooks/c")
    (job,) = claim("w-dead", batch=1).jobs  # no workers row: a dead worker ...
    begun = delivery.begin_attempt(d.pk)
    assert begun.kind is delivery.Begin.CLAIMED  # the attempt holds the delivery's lease
    expire_lease(job.job_id)  # ... once its lease ran out, as the reaper judges it
    assert cancel(job.job_id).ended
    sticks(d)
    [attempt] = DeliveryAttempt.objects.filter(delivery=d)
    assert attempt.state == AttemptState.ABANDONED and "cancelled" in attempt.error
    # The dead worker's attempt, had it been alive after all, cannot record an answer.
    assert delivery.record(begun.lease, delivery.Attempted(AttemptState.SUCCEEDED, status_code=200)).stale
    d.refresh_from_db()
    assert d.state == DeliveryState.CANCELLED
