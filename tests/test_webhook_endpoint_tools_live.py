"""A test event and a merchant's retry, delivered for real: asked for through the API, sent
by a real ``runworker`` to a real sandbox receiver process, which verifies the signature.
Judged by the receiver's own record and the deliveries list."""

from __future__ import annotations

import time

import pytest

from sandbox.receiver import fingerprint
from tests.conftest import wait_for
from tests.factories.webhooks import EndpointFactory, EventFactory
from tests.queue_support import scalar
from tests.test_webhook_worker import BASE_ENV
from webhooks.models import WebhookDelivery
from webhooks.services.delivery import dedupe_key

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),  # this process; BASE_ENV allows the worker the same
]


def state_of(delivery_id: int) -> str:
    return WebhookDelivery.objects.values_list("state", flat=True).get(pk=delivery_id)


def test_a_test_event_arrives_signed_at_that_endpoint_only(acme, globex, receiver, start_worker):
    target = EndpointFactory(merchant=acme.merchant, url=receiver.url("/target"), enabled_events=["refund.failed"])
    other = EndpointFactory(merchant=acme.merchant, url=receiver.url("/other"))
    EndpointFactory(merchant=globex.merchant, url=receiver.url("/theirs"))
    receiver.add_secrets(target.secret, other.secret)
    start_worker("--concurrency", "2", env=BASE_ENV).wait_started()

    response = acme.call("POST", f"/v1/webhook_endpoints/{target.pk}/test")
    assert response.status_code == 200, response.content
    delivery = response.json()
    wait_for(lambda: receiver.received(), timeout=30, message="the test event to arrive")
    time.sleep(1.5)  # three fan-out drain periods: anything fanned out elsewhere would have gone by now
    [got] = receiver.received()
    assert (got["path"], got["type"], got["event_id"], got["attempt"]) == (
        "/target",
        "webhook_endpoint.test",
        delivery["event"],
        "1",
    )
    assert got["verified"] and got["verified_by"] == [fingerprint(target.secret)]
    wait_for(lambda: state_of(WebhookDelivery.objects.get(public_id=delivery["id"]).pk) == "succeeded", timeout=10, message="the delivery recorded")
    [listed] = acme.call("GET", f"/v1/webhook_endpoints/{target.pk}/deliveries").json()["data"]
    assert listed["id"] == delivery["id"] and listed["state"] == "succeeded"
    [attempt] = listed["attempts"]
    assert (attempt["number"], attempt["state"], attempt["status_code"]) == (1, "succeeded", 200)
    assert attempt["finished"] >= attempt["started"] and attempt["duration_ms"] >= 0


def test_a_retried_exhausted_delivery_is_delivered_and_a_retry_while_it_is_in_flight_is_a_409(
    acme, receiver, start_worker
):
    target = EndpointFactory(merchant=acme.merchant, url=receiver.url("/flaky"))
    receiver.add_secrets(target.secret)
    receiver.set_mode("/flaky", "status", status=500)
    event_id = EventFactory(merchant=acme.merchant).pk
    start_worker("--concurrency", "2", env={**BASE_ENV, "VPAY_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2"})
    delivery = wait_for(
        lambda: WebhookDelivery.objects.filter(event_id=event_id, state="exhausted").first(),
        timeout=60,
        message="the delivery to exhaust its ladder",
    )
    assert len(receiver.received()) == 3
    # The run that exhausted it finishes its job first. A retry landing between that run's
    # record and its job's finish finds the job's name taken and waits for the backstop
    # scan (docs/ops-console.md, "Resend…": a known gap, not what this test is about).
    wait_for(
        lambda: scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [dedupe_key(delivery.pk)]) == 0,
        timeout=30,
        message="the exhausting run to finish its job",
    )

    # The receiver is fixed, but answers slowly: the retry is still in flight when asked again.
    receiver.set_mode("/flaky", "slow", delay=1.5)  # under VPAY_WEBHOOK_TIMEOUT (2 s)
    path = f"/v1/webhook_endpoints/{target.pk}/deliveries/{delivery.public_id}/retry"
    first = acme.call("POST", path, key="retry-once")
    assert first.status_code == 200, first.content
    assert first.json()["state"] == "pending"
    wait_for(lambda: len(receiver.received()) == 4, timeout=30, message="the retried attempt to arrive")
    in_flight = acme.call("POST", path, key="retry-twice")
    assert in_flight.status_code == 409, in_flight.content
    assert in_flight.json()["error"]["code"] == "webhook_delivery_in_progress"
    assert acme.call("POST", path, key="retry-once").content == first.content  # the key replays

    wait_for(lambda: state_of(delivery.pk) == "succeeded", timeout=30, message="the retry to be delivered")
    got = receiver.received()
    assert [r["attempt"] for r in got] == ["1", "2", "3", "4"]
    assert got[3]["verified"] and got[3]["event_id"] == event_id
    [listed] = acme.call("GET", f"/v1/webhook_endpoints/{target.pk}/deliveries").json()["data"]
    assert listed["attempt_count"] == 4
    assert [(a["number"], a["state"], a["status_code"]) for a in listed["attempts"]] == [
        (1, "failed", 500),
        (2, "failed", 500),
        (3, "failed", 500),
        (4, "succeeded", 200),
    ]
