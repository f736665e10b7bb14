"""The outbox drain fans a page of events out in one transaction, by the same rule as one
event at a time; a page that fails goes event by event, so nothing is held back."""

from __future__ import annotations

import ipaddress

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from merchants.services import create_merchant
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import Event, WebhookDelivery
from webhooks.services import endpoints, fanout
from webhooks.services.delivery import dedupe_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def two_merchants_and_their_events():
    """Endpoints that want everything, one type, another type, and one disabled; events of
    several types, about an endpoint, and a test event; the pairs one-by-one fan-out makes."""
    acme, other = create_merchant("Acme")[0], create_merchant("Other")[0]
    url = "http://127.0.0.1:9/hooks"
    every, _ = endpoints.create_endpoint(acme, url=url, enabled_events=["*"])
    typed, _ = endpoints.create_endpoint(
        acme, url=url, enabled_events=["payment_intent.succeeded", "webhook_endpoint.failing"]
    )
    customers, _ = endpoints.create_endpoint(acme, url=url, enabled_events=["customer.deleted"])
    disabled, _ = endpoints.create_endpoint(acme, url=url, enabled_events=["*"])
    sql("UPDATE webhook_endpoints SET disabled_at = now(), disabled_reason = 'paused', disabled_by = 'merchant' WHERE id = %s", [disabled.id])
    elsewhere, _ = endpoints.create_endpoint(other, url=url, enabled_events=["*"])
    with transaction.atomic():
        paid = [emit(acme, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"}) for i in range(3)]
        deleted = emit(acme, EventType.CUSTOMER_DELETED, {"id": "cus_1", "object": "customer"})
        failing = emit(acme, EventType.WEBHOOK_ENDPOINT_FAILING, {"id": every.id, "object": "webhook_endpoint"})
        test = emit(acme, EventType.WEBHOOK_ENDPOINT_TEST, {"id": typed.id, "object": "webhook_endpoint"})
        theirs = emit(other, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_x", "object": "payment_intent"})
    expected = {(e.pk, ep) for e in paid for ep in (every.id, typed.id)}
    expected |= {(deleted.pk, every.id), (deleted.pk, customers.id)}
    expected |= {(failing.pk, typed.id)}  # not to `every`, which it is about, though it wants all
    expected |= {(test.pk, typed.id), (theirs.pk, elsewhere.id)}
    events = [*paid, deleted, failing, test, theirs]
    assert len({e.merchant_id for e in events}) == 2
    return events, expected


def test_a_page_makes_exactly_the_deliveries_one_event_at_a_time_would_with_a_job_each(caplog):
    events, expected = two_merchants_and_their_events()
    result = fanout.drain_once()
    assert not [r for r in caplog.records if "page failed" in r.getMessage()]  # the page did it
    assert (result.seen, result.fanned_out, result.deliveries, result.failed) == (len(events), len(events), 11, 0)
    assert set(WebhookDelivery.objects.values_list("event_id", "endpoint_id")) == expected
    assert set(Event.objects.values_list("fan_out", flat=True)) == {"fanned_out"}
    jobs = sql("SELECT dedupe_key, tenant, correlation_id FROM jobs WHERE kind = 'webhook_deliver'")
    merchant_of = {e.pk: e.merchant_id for e in events}
    assert sorted(jobs) == sorted(
        (dedupe_key(d.pk), merchant_of[d.event_id], d.event_id) for d in WebhookDelivery.objects.all()
    )


def test_one_event_at_a_time_makes_the_same_deliveries():
    events, expected = two_merchants_and_their_events()
    for event in events:
        fanout.fan_out_event(event.pk)
    assert set(WebhookDelivery.objects.values_list("event_id", "endpoint_id")) == expected


def test_a_page_is_one_transaction_whatever_its_size():
    acme = create_merchant("Acme")[0]
    endpoints.create_endpoint(acme, url="http://127.0.0.1:9/hooks", enabled_events=["*"])

    def statements_for(n: int) -> int:
        with transaction.atomic():
            for i in range(n):
                emit(acme, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{n}_{i}", "object": "payment_intent"})
        with CaptureQueriesContext(connection) as queries:
            assert fanout.drain_once().fanned_out == n
        return len(queries)

    assert statements_for(2) == statements_for(40)


def test_a_page_that_fails_holds_no_event_back_and_the_failing_event_is_never_in_a_page_again(caplog):
    events, _ = two_merchants_and_their_events()
    poison = events[1]
    sql(
        "CREATE FUNCTION test_refuse() RETURNS trigger AS $$ BEGIN IF NEW.event_id = %s"
        " THEN RAISE EXCEPTION 'refused by test trigger'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
        [poison.pk],
    )
    sql("CREATE TRIGGER test_refuse BEFORE INSERT ON webhook_deliveries FOR EACH ROW EXECUTE FUNCTION test_refuse()")
    try:
        first = fanout.drain_once()
        acme = events[0].merchant
        with transaction.atomic():
            later = [emit(acme, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_l{i}", "object": "payment_intent"})
                     for i in range(3)]  # fmt: skip
        caplog.clear()
        second = fanout.drain_once()
    finally:
        sql("DROP TRIGGER test_refuse ON webhook_deliveries")
        sql("DROP FUNCTION test_refuse()")
    assert (first.fanned_out, first.failed) == (len(events) - 1, 1)
    # The next pass: the later events in a page that did not fail, the poison on its own.
    assert (second.fanned_out, second.failed) == (len(later), 1)
    assert not [r for r in caplog.records if "page failed" in r.getMessage()]
    assert sql("SELECT fan_out, fan_out_failures FROM events WHERE id = %s", [poison.pk]) == [("pending", 2)]
    assert not WebhookDelivery.objects.filter(event_id=poison.pk).exists()
    assert fanout.drain_once().fanned_out == 1  # healed: the next pass takes it
