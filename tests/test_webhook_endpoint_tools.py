"""What a merchant asks of its webhook endpoints beyond configuring them: a test event, the
deliveries list with attempts, a retry of one delivery, and ``GET /v1/event_types``.
Django's test client, real database (the live deliveries: ``test_webhook_endpoint_tools_live.py``)."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.models import Job
from tests.api_support import MerchantClient, error_of
from tests.factories.webhooks import DeliveryFactory, EndpointFactory
from webhooks.delivery_wire import ATTEMPTS_SHOWN, EXCERPT_SHOWN
from webhooks.event_types import DESCRIPTIONS, EventType
from webhooks.models import DeliveryAttempt, Event, WebhookDelivery
from webhooks.services.delivery import dedupe_key
from webhooks.services.fanout import drain_once

pytestmark = pytest.mark.django_db


def set_state(delivery_id: int, state: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_deliveries SET state = %s, completed_at = now() WHERE id = %s", [state, delivery_id]
        )


def wire_id(delivery_id: int) -> str:
    return WebhookDelivery.objects.values_list("public_id", flat=True).get(pk=delivery_id)


def deliver_jobs(delivery_id: int) -> int:
    return Job.objects.filter(dedupe_key=dedupe_key(delivery_id)).count()


# --- event types ----------------------------------------------------------------------------


def test_event_types_lists_every_type_with_its_line(acme):
    response = acme.call("GET", "/v1/event_types")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["has_more"] is False
    assert [row["type"] for row in body["data"]] == EventType.values
    assert all(row["object"] == "event_type" and row["description"] for row in body["data"])
    assert set(DESCRIPTIONS) == set(EventType.values)
    assert error_of(acme.call("GET", "/v1/event_types?limit=5"))["code"] == "parameter_unknown"


# --- test events ------------------------------------------------------------------------------


def test_a_test_event_makes_one_delivery_to_that_endpoint_only_whatever_it_subscribes_to(acme, globex):
    target = EndpointFactory(merchant=acme.merchant, enabled_events=["refund.failed"])
    other = EndpointFactory(merchant=acme.merchant)
    theirs = EndpointFactory(merchant=globex.merchant)

    response = acme.call("POST", f"/v1/webhook_endpoints/{target.pk}/test")
    assert response.status_code == 200, response.content
    delivery = response.json()
    assert delivery["object"] == "webhook_delivery" and delivery["id"].startswith("whd_")
    assert (delivery["webhook_endpoint"], delivery["event_type"], delivery["state"]) == (
        target.pk,
        "webhook_endpoint.test",
        "pending",
    )
    event = Event.objects.get(pk=delivery["event"])
    assert event.fan_out == "fanned_out"  # the drain has nothing left to fan out
    assert list(event.deliveries.values_list("endpoint_id", flat=True)) == [target.pk]
    assert deliver_jobs(event.deliveries.get().pk) == 1
    drain_once()  # a drain pass afterwards adds nobody
    assert WebhookDelivery.objects.filter(endpoint_id__in=[other.pk, theirs.pk]).count() == 0
    # The event is the merchant's, readable like any other; its object is the endpoint, no secret.
    listed = acme.call("GET", "/v1/events?types[]=webhook_endpoint.test").json()["data"]
    assert [e["id"] for e in listed] == [event.pk]
    assert listed[0]["data"]["object"]["id"] == target.pk and "secret" not in listed[0]["data"]["object"]
    assert target.secret not in response.content.decode()


def test_a_test_event_to_a_disabled_endpoint_is_a_409_and_writes_nothing(acme, acme_endpoint):
    acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/disable")
    before = Event.objects.count()
    response = acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/test")
    assert response.status_code == 409 and error_of(response)["code"] == "webhook_endpoint_disabled"
    assert Event.objects.count() == before and WebhookDelivery.objects.count() == 0


def test_a_test_event_refuses_a_body(acme, acme_endpoint):
    response = acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/test", {"type": "refund.failed"})
    assert response.status_code == 400 and error_of(response)["param"] == "type"


# --- the deliveries list ------------------------------------------------------------------------


def test_deliveries_list_newest_first_with_attempts_and_nothing_secret(acme, acme_endpoint):
    first, second = DeliveryFactory.create_batch(2, endpoint=acme_endpoint)
    DeliveryAttempt.objects.create(
        delivery=first,
        number=1,
        lease_token="00000000-0000-0000-0000-000000000001",
        state="failed",
        status_code=500,
        duration_ms=12,
        response_excerpt="x" * 4000,
    )
    WebhookDelivery.objects.filter(pk=first.pk).update(attempts=1)
    response = acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries")
    assert response.status_code == 200
    rows = response.json()["data"]
    assert [r["id"] for r in rows] == [second.public_id, first.public_id]
    assert rows[0]["attempts"] == [] and rows[0]["attempt_count"] == 0
    [attempt] = rows[1]["attempts"]
    assert (attempt["number"], attempt["state"], attempt["status_code"], attempt["duration_ms"]) == (
        1,
        "failed",
        500,
        12,
    )
    assert isinstance(attempt["started"], int) and attempt["finished"] is None
    assert len(attempt["response_excerpt"]) == EXCERPT_SHOWN and attempt["response_excerpt"].endswith("…")
    text = response.content.decode()
    assert acme_endpoint.secret not in text and "signature" not in text.lower()


def test_deliveries_show_the_latest_attempts_and_count_them_all(acme, acme_endpoint):
    delivery = DeliveryFactory(endpoint=acme_endpoint)
    total = ATTEMPTS_SHOWN + 5
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(delivery=delivery, number=n, lease_token=f"00000000-0000-0000-0000-{n:012d}", state="failed")
        for n in range(1, total + 1)
    )
    WebhookDelivery.objects.filter(pk=delivery.pk).update(attempts=total)
    [row] = acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries").json()["data"]
    assert row["attempt_count"] == total
    assert [a["number"] for a in row["attempts"]] == list(range(total - ATTEMPTS_SHOWN + 1, total + 1))


def test_deliveries_page_both_ways_and_filter_by_state(acme, acme_endpoint):
    made = [d.public_id for d in DeliveryFactory.create_batch(5, endpoint=acme_endpoint)][::-1]  # newest first
    path = f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries"
    page = acme.call("GET", f"{path}?limit=2&starting_after={made[1]}").json()
    assert [r["id"] for r in page["data"]] == made[2:4] and page["has_more"] is True
    back = acme.call("GET", f"{path}?limit=2&ending_before={made[2]}").json()
    assert [r["id"] for r in back["data"]] == made[0:2] and back["has_more"] is False
    set_state(WebhookDelivery.objects.get(public_id=made[3]).pk, "exhausted")
    assert [r["id"] for r in acme.call("GET", f"{path}?state=exhausted").json()["data"]] == [made[3]]
    for cursor in ("whd_x", "whd_99999999", "42", made[0] + "0"):
        response = acme.call("GET", f"{path}?starting_after={cursor}")
        assert response.status_code == 404 and error_of(response)["code"] == "resource_missing", cursor


def test_another_merchants_endpoint_and_delivery_are_404(acme, globex, acme_endpoint):
    theirs = EndpointFactory(merchant=globex.merchant)
    their_delivery = DeliveryFactory(endpoint=theirs)
    set_state(their_delivery.pk, "exhausted")
    wire = their_delivery.public_id
    for method, path in [
        ("GET", f"/v1/webhook_endpoints/{theirs.pk}/deliveries"),
        ("POST", f"/v1/webhook_endpoints/{theirs.pk}/test"),
        ("POST", f"/v1/webhook_endpoints/{theirs.pk}/deliveries/{wire}/retry"),
        ("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries/{wire}/retry"),
    ]:
        response = acme.call(method, path)
        assert response.status_code == 404 and error_of(response)["code"] == "resource_missing", path
    # Their delivery's cursor under my endpoint names nothing of mine.
    response = acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries?starting_after={wire}")
    assert response.status_code == 404
    assert WebhookDelivery.objects.get(pk=their_delivery.pk).state == "exhausted"
    assert Event.objects.filter(merchant=globex.merchant).count() == 1 and deliver_jobs(their_delivery.pk) == 1


def test_delivery_ids_are_random_and_say_nothing_of_the_platforms_volume(acme, acme_endpoint):
    # whd_1, whd_2… told anyone with an endpoint how many deliveries vpay makes.
    made = DeliveryFactory.create_batch(3, endpoint=acme_endpoint)
    path = f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries"
    listed = [row["id"] for row in acme.call("GET", path).json()["data"]]
    assert all(re.fullmatch(r"whd_[0-9a-f]{32}", wire) for wire in listed), listed
    assert len(set(listed)) == 3
    for d in made:
        set_state(d.pk, "exhausted")
        # The sequential form names nothing, as a cursor or in a path.
        assert acme.call("GET", f"{path}?starting_after=whd_{d.pk}").status_code == 404
        assert acme.call("POST", f"{path}/whd_{d.pk}/retry").status_code == 404


# --- retry -------------------------------------------------------------------------------------


def retry(api: MerchantClient, endpoint_id: str, delivery_id: int, **kwargs):
    return api.call(
        "POST", f"/v1/webhook_endpoints/{endpoint_id}/deliveries/{wire_id(delivery_id)}/retry", **kwargs
    )


@pytest.mark.parametrize("finished", ["exhausted", "refused", "succeeded"])
def test_a_finished_delivery_is_retried_once_and_a_second_retry_is_a_409(acme, acme_endpoint, finished):
    delivery = DeliveryFactory(endpoint=acme_endpoint)
    Job.objects.filter(dedupe_key=dedupe_key(delivery.pk)).delete()  # its first job ran
    set_state(delivery.pk, finished)

    response = retry(acme, acme_endpoint.pk, delivery.pk, key="retry-1")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "pending" and response.json()["completed"] is None
    assert deliver_jobs(delivery.pk) == 1
    # The same Idempotency-Key replays the answer; a new request finds it pending: a 409.
    replay = retry(acme, acme_endpoint.pk, delivery.pk, key="retry-1")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.content == response.content
    again = retry(acme, acme_endpoint.pk, delivery.pk, key="retry-2")
    assert again.status_code == 409 and error_of(again)["code"] == "webhook_delivery_in_progress"
    assert deliver_jobs(delivery.pk) == 1


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("pending", "webhook_delivery_in_progress"),
        ("cancelled", "webhook_delivery_not_retryable"),
    ],
)
def test_a_delivery_not_finished_or_cancelled_is_not_retried(acme, acme_endpoint, state, code):
    delivery = DeliveryFactory(endpoint=acme_endpoint)
    if state != "pending":
        set_state(delivery.pk, state)
    response = retry(acme, acme_endpoint.pk, delivery.pk)
    assert response.status_code == 409 and error_of(response)["code"] == code
    assert state in error_of(response)["message"]


def test_a_delivering_delivery_is_not_retried(acme, acme_endpoint):
    delivery = DeliveryFactory(endpoint=acme_endpoint)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_deliveries SET state = 'delivering', lease_token = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 minute' WHERE id = %s",
            [delivery.pk],
        )
    response = retry(acme, acme_endpoint.pk, delivery.pk)
    assert response.status_code == 409 and error_of(response)["code"] == "webhook_delivery_in_progress"
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "delivering"


def test_a_retry_to_a_disabled_endpoint_is_a_409(acme, acme_endpoint):
    delivery = DeliveryFactory(endpoint=acme_endpoint)
    set_state(delivery.pk, "exhausted")
    acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/disable")
    response = retry(acme, acme_endpoint.pk, delivery.pk)
    assert response.status_code == 409 and error_of(response)["code"] == "webhook_endpoint_disabled"
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "exhausted"


# --- the plan ---------------------------------------------------------------------------------


def test_the_deliveries_list_reads_its_index_without_a_sort(acme, acme_endpoint):
    made = DeliveryFactory.create_batch(3, endpoint=acme_endpoint)
    for query in ("", f"?ending_before={made[0].public_id}", "?state=pending&created[gte]=0"):
        with CaptureQueriesContext(connection) as captured:
            response = acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}/deliveries{query}")
        assert response.status_code == 200
        [sql] = [
            q["sql"]
            for q in captured.captured_queries
            if q["sql"].startswith('SELECT "webhook_deliveries"') and "LIMIT 11" in q["sql"]
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            # Sorts off too: near-empty tables' statistics left by earlier tests can tip the
            # planner to the endpoint index plus a sort; with both off it still sorts when no
            # index serves the order, which is what this asserts (as tests/test_list_filters.py).
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "webhook_deliveries_ep_created" in plan and "Sort" not in plan, plan
