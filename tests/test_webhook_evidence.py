"""What a delivery's rows say about what went on the wire, against the real database and
a real receiver process: the first digest is of a body that may have reached a receiver,
and an attempt's first terminal state is the one it keeps."""

from __future__ import annotations

import hashlib
import ipaddress
import socket

import pytest
from django.db import connection, transaction

from merchants.services import create_merchant
from tests.webhook_support import free_port
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import AttemptState, DeliveryAttempt, DeliveryState, WebhookDelivery
from webhooks.services import delivery, endpoints, fanout, scan

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_LEASE_SECONDS = 30.0


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def one_delivery(url: str) -> WebhookDelivery:
    m = create_merchant("Acme")[0]
    endpoints.create_endpoint(m, url=url, enabled_events=["*"])
    with transaction.atomic():
        event = emit(m, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent", "amount": 1})
    fanout.drain_once()
    return WebhookDelivery.objects.get(event=event)


def attempt(d: WebhookDelivery, **perform_options) -> delivery.Attempted:
    begun = delivery.begin_attempt(d.pk)
    assert begun.kind is delivery.Begin.CLAIMED
    attempted = delivery.perform(begun.lease, **perform_options)
    delivery.record(begun.lease, attempted)
    d.refresh_from_db()
    return attempted


def body_digest(d: WebhookDelivery) -> str:
    return hashlib.sha256(delivery.render_body(d.event)).hexdigest()


# --- the digest: only of a body that may have left -------------------------------------


def test_an_attempt_whose_host_did_not_resolve_stores_no_digest_and_the_first_sent_one_does(receiver):
    d = one_delivery(f"http://hooks.example.test:{receiver.port}/hooks/dns")

    def no_such_host(host, port):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    attempted = attempt(d, resolver=no_such_host)
    assert attempted.attempt_state == AttemptState.NO_RESPONSE and "could not resolve" in attempted.detail
    assert attempted.payload_sha256 is None
    assert (d.state, d.payload_sha256) == (DeliveryState.PENDING, None)  # nothing left the process
    # The next attempt resolves and sends: its digest is the first one stored.
    attempt(d, resolver=lambda host, port: ["127.0.0.1"])
    assert (d.state, d.payload_sha256) == (DeliveryState.SUCCEEDED, body_digest(d))
    [got] = receiver.received("/hooks/dns")
    assert got["body_sha256"] == d.payload_sha256


def test_an_attempt_that_spent_its_budget_before_sending_stores_no_digest(receiver, settings):
    # A budget so small it is gone before the connect: the address is vetted (an IP
    # literal: no lookup), and nothing is left to send with.
    settings.VPAY_WEBHOOK_TIMEOUT = 1e-9
    d = one_delivery(receiver.url("/hooks/budget"))
    attempted = attempt(d)
    assert attempted.attempt_state == AttemptState.NO_RESPONSE and "nothing sent" in attempted.error
    assert d.payload_sha256 is None
    assert receiver.received("/hooks/budget") == []


def test_an_attempt_whose_connection_was_refused_stores_no_digest():
    d = one_delivery(f"http://127.0.0.1:{free_port()}/hooks/nobody")  # nothing listens there
    attempted = attempt(d)
    assert attempted.attempt_state == AttemptState.NO_RESPONSE and attempted.status_code is None
    assert "ConnectError" in attempted.detail and attempted.error == "the endpoint refused the connection"
    assert d.payload_sha256 is None


def test_a_request_that_left_without_an_answer_stores_its_digest(receiver):
    d = one_delivery(receiver.url("/hooks/drop?mode=drop"))  # reads the request, answers nothing
    attempted = attempt(d)
    assert attempted.attempt_state == AttemptState.NO_RESPONSE and attempted.status_code is None
    assert d.payload_sha256 == body_digest(d)  # the bytes were signed and sent; only the answer is missing


# --- an attempt keeps its first terminal state -----------------------------------------


def test_a_late_finisher_leaves_an_abandoned_attempt_abandoned(receiver):
    d = one_delivery(receiver.url("/hooks/late"))
    begun = delivery.begin_attempt(d.pk)
    answer = delivery.perform(begun.lease)
    assert answer.status_code == 200
    # The worker stalls past its lease; the backstop recovers it first.
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d.pk])
    assert scan.scan_once().recovered == 1
    before = DeliveryAttempt.objects.get(pk=begun.lease.attempt_id)
    assert before.state == AttemptState.ABANDONED
    # The stalled worker comes back with its 200: discarded, and the record stays as it was.
    assert delivery.record(begun.lease, answer).stale
    after = DeliveryAttempt.objects.get(pk=begun.lease.attempt_id)
    assert (after.state, after.error, after.finished_at, after.duration_ms) == (
        AttemptState.ABANDONED,
        before.error,
        before.finished_at,
        before.duration_ms,
    )
    d.refresh_from_db()
    assert d.state == DeliveryState.PENDING  # the recovery's decision stands too
