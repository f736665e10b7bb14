"""Webhooks in the ops console: pages render without secrets; resend and re-drive are two
steps with a required reason (a confirmation page that writes nothing, then the act, with
who and why on each row's History) and need their permissions; list pages run a fixed
number of queries whatever the number of rows."""

from __future__ import annotations

import ipaddress
import itertools

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from merchants.services import create_merchant
from tests.queue_support import execute
from webhooks import admin_actions
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryAttempt, DeliveryState, Event, WebhookDelivery
from webhooks.services import delivery, endpoints, fanout
from webhooks.services.resend import resend_delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0,)  # two tries, then exhausted


def exhausted_delivery(receiver):
    merchant, _ = create_merchant("Acme")
    endpoint, secret = endpoints.create_endpoint(
        merchant, url=receiver.url("/hooks/fail?mode=status&status=500"), enabled_events=["*"]
    )
    with transaction.atomic():
        emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
    fanout.drain_once()
    d = WebhookDelivery.objects.get()
    for _ in range(2):
        begun = delivery.begin_attempt(d.pk)
        delivery.record(begun.lease, delivery.perform(begun.lease))
    d.refresh_from_db()
    assert d.state == DeliveryState.EXHAUSTED
    return d, endpoint, secret


def test_resend_gives_a_fresh_ladder_and_attempt_numbers_keep_counting(receiver):
    d, _, _ = exhausted_delivery(receiver)
    assert resend_delivery(d.pk)
    assert not resend_delivery(d.pk)  # pending now: not resendable twice
    d.refresh_from_db()
    assert (d.state, d.ladder_base, d.attempts) == (DeliveryState.PENDING, 2, 2)
    begun = delivery.begin_attempt(d.pk)
    assert begun.lease.number == 3 and begun.lease.rung == 1
    recorded = delivery.record(begun.lease, delivery.perform(begun.lease))
    assert recorded.delivery_state == DeliveryState.PENDING  # rung 1 of a fresh ladder, not exhausted
    begun = delivery.begin_attempt(d.pk)
    assert delivery.record(begun.lease, delivery.perform(begun.lease)).delivery_state == DeliveryState.EXHAUSTED
    assert list(DeliveryAttempt.objects.filter(delivery=d).order_by("number").values_list("number", flat=True)) == [
        1,
        2,
        3,
        4,
    ]


def test_the_console_shows_no_secret_and_resends_with_permission(receiver):
    d, endpoint, secret = exhausted_delivery(receiver)
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_webhookdelivery", "view_deliveryattempt", "view_webhookendpoint", "view_event"]
        )
    )
    client = Client()
    client.force_login(staff)
    for url in (
        "/admin/webhooks/webhookendpoint/",
        f"/admin/webhooks/webhookendpoint/{quote(endpoint.pk)}/change/",
        "/admin/webhooks/webhookdelivery/",
        f"/admin/webhooks/webhookdelivery/{d.pk}/change/",
        "/admin/webhooks/event/",
        f"/admin/webhooks/event/{quote(d.event_id)}/change/",
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert secret not in response.content.decode()
    page = client.get(f"/admin/webhooks/webhookdelivery/{d.pk}/change/").content.decode()
    assert "told to fail" in page  # the attempts' excerpts are shown inline
    action = {"action": "resend_selected", "_selected_action": [d.pk], "post": "yes", "reason": "merchant fixed it"}
    client.post("/admin/webhooks/webhookdelivery/", action)
    d.refresh_from_db()
    assert d.state == DeliveryState.EXHAUSTED  # no permission: the action is not even offered
    staff.user_permissions.add(Permission.objects.get(codename="resend_webhookdelivery"))
    client.post("/admin/webhooks/webhookdelivery/", action)
    d.refresh_from_db()
    assert d.state == DeliveryState.PENDING
    [entry] = LogEntry.objects.filter(object_id=str(d.pk), user=staff)
    assert entry.change_message == "Resent (fresh retry ladder): merchant fixed it"


def test_abandoned_events_are_re_driven_from_the_console_only_with_permission():
    merchant, _ = create_merchant("Acme")
    with transaction.atomic():
        event = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
    Event.objects.filter(pk=event.pk).update(fan_out="abandoned", fan_out_failures=5, fan_out_transient_failures=7)
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_event"))
    client = Client()
    client.force_login(staff)
    action = {"action": "redrive_selected", "_selected_action": [event.pk], "post": "yes", "reason": "rail fixed"}
    assert "redrive_selected" not in client.get("/admin/webhooks/event/").content.decode()
    client.post("/admin/webhooks/event/", action)
    assert Event.objects.get(pk=event.pk).fan_out == "abandoned"  # no permission: not offered
    staff.user_permissions.add(Permission.objects.get(codename="redrive_event"))
    assert "redrive_selected" in client.get("/admin/webhooks/event/").content.decode()
    client.post("/admin/webhooks/event/", action)
    event.refresh_from_db()
    assert (event.fan_out, event.fan_out_failures, event.fan_out_transient_failures, event.fan_out_redrives) == (
        "pending",
        0,
        0,
        1,
    )
    [entry] = LogEntry.objects.filter(object_id=event.pk, user=staff)
    assert entry.change_message == "Re-driven: fan-out failures reset, back to pending. Reason: rail fixed"
    client.post("/admin/webhooks/event/", action)  # pending: skipped, nothing written
    assert LogEntry.objects.filter(object_id=event.pk).count() == 1
    assert fanout.drain_once().fanned_out == 1


# --- the two steps ------------------------------------------------------------------------

DELIVERIES = "/admin/webhooks/webhookdelivery/"


def deliveries_in(states: list[str], merchant_name: str = "Acme") -> list[int]:
    """One delivery per state (the state set in SQL: how it got there is not the subject)."""
    merchant, _ = create_merchant(merchant_name)
    endpoints.create_endpoint(merchant, url="https://hooks.example.com/in", enabled_events=["*"])
    for i in range(len(states)):
        with transaction.atomic():
            emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"})
    fanout.drain_once()
    ids = list(WebhookDelivery.objects.filter(endpoint__merchant=merchant).order_by("id").values_list("id", flat=True))
    for delivery_id, state in zip(ids, states, strict=True):
        WebhookDelivery.objects.filter(pk=delivery_id).update(state=state, attempts=2)
    return ids


def resender(client):
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookdelivery", "resend_webhookdelivery"])
    )
    client.force_login(staff)
    return staff


def test_resend_asks_first_says_which_already_succeeded_and_writes_nothing_until_confirmed(client):
    resender(client)
    exhausted, succeeded, pending = deliveries_in(["exhausted", "succeeded", "pending"])
    ids = [exhausted, succeeded, pending]
    page = client.post(DELIVERIES, {"action": "resend_selected", "index": 0, "_selected_action": ids})
    assert page.status_code == 200
    body = page.content.decode()
    assert "admin/webhooks/webhookdelivery/resend_confirmation.html" in [t.name for t in page.templates]
    assert 'id="already-succeeded"' in body and "1 of the selected delivery" in body
    assert "already succeeded: the receiver answered 2xx; not sent again unless you tick" in body
    assert "waiting for its next attempt already" in body
    assert 'name="reason"' in body and 'name="include_succeeded"' in body
    # The confirmation step changed nothing.
    assert dict(WebhookDelivery.objects.values_list("id", "state")) == {
        exhausted: "exhausted",
        succeeded: "succeeded",
        pending: "pending",
    }
    assert LogEntry.objects.count() == 0


@pytest.mark.parametrize("reason", ["", "   "], ids=["empty", "blank"])
def test_resend_without_a_reason_is_refused_and_writes_nothing(client, reason):
    resender(client)
    (exhausted,) = deliveries_in(["exhausted"])
    refused = client.post(
        DELIVERIES, {"action": "resend_selected", "_selected_action": [exhausted], "post": "yes", "reason": reason}
    )
    assert refused.status_code == 400
    assert b"A reason is required to resend" in refused.content
    assert WebhookDelivery.objects.get(pk=exhausted).state == "exhausted"
    assert LogEntry.objects.count() == 0


def test_resend_confirmed_resends_failed_ones_and_a_succeeded_one_only_when_ticked(client):
    staff = resender(client)
    exhausted, refused, succeeded, pending = deliveries_in(["exhausted", "refused", "succeeded", "pending"])
    ids = [exhausted, refused, succeeded, pending]
    confirm = {"action": "resend_selected", "_selected_action": ids, "post": "yes", "reason": "  outage over "}
    response = client.post(DELIVERIES, confirm)
    assert response.status_code == 302
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    assert f"Resent 2 deliveries: #{exhausted}, #{refused}." in msgs
    assert any(f"#{succeeded} already succeeded" in m for m in msgs)
    assert any(f"#{pending} waiting for its next attempt" in m for m in msgs)
    states = dict(WebhookDelivery.objects.values_list("id", "state"))
    assert [states[i] for i in ids] == ["pending", "pending", "succeeded", "pending"]
    messages_by_id = dict(LogEntry.objects.filter(user=staff).values_list("object_id", "change_message"))
    assert messages_by_id == {str(exhausted): "Resent (fresh retry ladder): outage over"} | {
        str(refused): "Resent (fresh retry ladder): outage over"
    }
    client.post(DELIVERIES, {**confirm, "_selected_action": [succeeded], "include_succeeded": "on"})
    assert WebhookDelivery.objects.get(pk=succeeded).state == "pending"
    assert LogEntry.objects.filter(object_id=str(succeeded)).count() == 1


def test_resend_verdict_table():
    for state, include_succeeded in itertools.product(DeliveryState, [False, True]):
        resent, note = admin_actions.resend_verdict(state, include_succeeded=include_succeeded)
        expected = state in ("exhausted", "refused") or (state == "succeeded" and include_succeeded)
        assert resent is expected, (state, include_succeeded)
        assert note  # every state says what happens to it
        assert ("already succeeded" in note) is (state == "succeeded")


def test_redrive_asks_first_and_refuses_a_blank_reason():
    merchant, _ = create_merchant("Acme")
    with transaction.atomic():
        abandoned = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
        fine = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_2", "object": "payment_intent"})
    Event.objects.filter(pk=abandoned.pk).update(fan_out="abandoned", fan_out_failures=5)
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_event", "redrive_event"]))
    client = Client()
    client.force_login(staff)
    ids = [abandoned.pk, fine.pk]
    page = client.post("/admin/webhooks/event/", {"action": "redrive_selected", "index": 0, "_selected_action": ids})
    body = page.content.decode()
    assert page.status_code == 200 and "Re-drive 1 abandoned event" in body
    assert "its fan-out is pending, not abandoned" in body
    blank = client.post(
        "/admin/webhooks/event/", {"action": "redrive_selected", "_selected_action": ids, "post": "yes", "reason": " "}
    )
    assert blank.status_code == 400 and b"A reason is required to re-drive" in blank.content
    assert Event.objects.get(pk=abandoned.pk).fan_out == "abandoned"
    assert LogEntry.objects.count() == 0


# --- list pages: no query per row ---------------------------------------------------------


def list_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


def test_the_list_pages_run_the_same_queries_for_three_rows_as_for_forty():
    staff = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(staff)
    pages = ("/admin/webhooks/webhookdelivery/", "/admin/webhooks/webhookendpoint/", "/admin/webhooks/event/")
    deliveries_in(["exhausted"] * 3, "Small")
    small = {url: list_queries(client, url) for url in pages}
    for n in range(12):  # 40 deliveries in all, each with attempts; 13 endpoints, each with a secret
        deliveries_in(["exhausted"] * (3 if n < 11 else 4), f"Merchant {n}")
    execute(
        "INSERT INTO webhook_delivery_attempts (delivery_id, number, lease_token, state, error)"
        " SELECT id, n, gen_random_uuid(), 'failed', 'HTTP 500 from the receiver #' || n"
        "   FROM webhook_deliveries, generate_series(1, 2) n"
    )
    assert WebhookDelivery.objects.count() == 40
    page = client.get("/admin/webhooks/webhookdelivery/").content.decode()
    assert "HTTP 500 from the receiver #2" in page  # the newest attempt's error, from the annotation
    assert "HTTP 500 from the receiver #1" not in page
    for url in pages:
        assert list_queries(client, url) == small[url], url  # a query per row would add 37
        assert small[url] <= 12, url
