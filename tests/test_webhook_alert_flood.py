"""A merchant cannot flood the operators' pager (issue 23 item 8): the alerts about one
endpoint's refused and exhausted deliveries are folded per period with a count — the
period's first at once, every later one counted on a second alert sent when the period
ends. Through the merchant's own API (``/test``), the three delivery steps, the real
database and the real ``send_alert`` job."""

from __future__ import annotations

import ipaddress
import logging

import pytest
from django.db import connection

from jobs.models import Alert, Job
from jobs.operator.alerts import display_title
from jobs.runner.worker import Worker
from tests.api_support import MerchantClient
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services import delivery, endpoints

pytestmark = pytest.mark.django_db(transaction=True)


def private(host, port):
    return ["10.9.8.7"]  # a nameserver that answers a private address


def loopback(host, port):
    return ["127.0.0.1"]  # the receiver's own address (allowed where a test says so)


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = ()
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0,)  # two tries, no wait between them
    settings.VPAY_ALERT_QUEUE = "alerts"
    settings.ALERT_WEBHOOK_URL = ""
    settings.VPAY_WEBHOOK_ALERT_PERIOD_SECONDS = 3600.0


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def attempt(delivery_id: int, resolver=private) -> str:
    begun = delivery.begin_attempt(delivery_id)
    return delivery.record(begun.lease, delivery.perform(begun.lease, resolver=resolver)).delivery_state


def test_a_test_event_loop_to_a_private_host_pages_once_and_counts_the_rest(caplog):
    acme = MerchantClient("Acme")
    ep, _ = endpoints.create_endpoint(acme.merchant, url="https://intranet.example/hook", enabled_events=["*"])
    other, _ = endpoints.create_endpoint(acme.merchant, url="https://wiki.example/hook", enabled_events=["*"])
    for _ in range(6):
        answer = acme.call("POST", f"/v1/webhook_endpoints/{ep.pk}/test")
        assert answer.status_code == 200, answer.content
        assert attempt(WebhookDelivery.objects.get(public_id=answer.json()["id"]).pk) == DeliveryState.REFUSED
    assert WebhookDelivery.objects.filter(endpoint=ep, state=DeliveryState.REFUSED).count() == 6

    # Two alerts for six refusals: the first, and the tally of the other five.
    first, tally = Alert.objects.filter(details__endpoint_id=ep.pk).order_by("id")
    assert first.source == tally.source == "webhooks.delivery_refused"
    assert (first.details["count"], tally.details["count"]) == (1, 5)
    assert "10.9.8.7" in first.details["first"]["reason"] and "10.9.8.7" in tally.details["latest"]["reason"]
    # The first is sent now; the tally when the period ends, with the count it has then.
    due_now, due_later = (Job.objects.filter(kind="send_alert", payload__alert_id=a.pk).get() for a in (first, tally))
    assert sql("SELECT run_at <= now() FROM jobs WHERE id = %s", [due_now.pk]) == [(True,)]
    assert sql(
        "SELECT run_at = to_timestamp(ceil(extract(epoch FROM now()) / 3600) * 3600) FROM jobs WHERE id = %s",
        [due_later.pk],
    ) == [(True,)]
    assert "5" in display_title(Alert.objects.get(pk=tally.pk)) and display_title(first) == first.title

    # Another endpoint's refusal is alerted on its own, at once.
    answer = acme.call("POST", f"/v1/webhook_endpoints/{other.pk}/test")
    attempt(WebhookDelivery.objects.get(public_id=answer.json()["id"]).pk)
    assert Alert.objects.filter(details__endpoint_id=other.pk).count() == 1

    # The worker logs the first now; the tally waits for its period's end.
    caplog.set_level(logging.INFO, logger="jobs.operator.alerts")
    worker = Worker(concurrency=1, queues=["alerts"])
    while worker.run_once():
        pass
    logged = [r.alert_key for r in caplog.records if getattr(r, "alert", False)]
    assert first.key in logged and tally.key not in logged
    sql("UPDATE jobs SET run_at = now() WHERE id = %s", [due_later.pk])
    worker.run_once()
    [line] = [r for r in caplog.records if getattr(r, "alert_key", None) == tally.key]
    assert "5 " in line.getMessage()


def test_exhausted_deliveries_of_one_endpoint_page_once_per_period(receiver, settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    acme = MerchantClient("Acme")
    ep, _ = endpoints.create_endpoint(
        acme.merchant, url=receiver.url("/down?mode=status&status=500"), enabled_events=["*"]
    )
    for _ in range(4):
        answer = acme.call("POST", f"/v1/webhook_endpoints/{ep.pk}/test")
        delivery_id = WebhookDelivery.objects.get(public_id=answer.json()["id"]).pk
        states = [attempt(delivery_id, resolver=loopback) for _ in range(2)]
        assert states == [DeliveryState.PENDING, DeliveryState.EXHAUSTED]
    alerts = list(Alert.objects.filter(details__endpoint_id=ep.pk).order_by("id"))
    assert [(a.source, a.details["count"]) for a in alerts] == [
        ("webhooks.delivery_exhausted", 1),
        ("webhooks.delivery_exhausted", 3),
    ]
