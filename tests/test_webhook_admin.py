"""Webhooks in the ops console: pages render without secrets; resend gives an exhausted
delivery a fresh ladder (and needs its permission)."""

from __future__ import annotations

import ipaddress

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import Client

from merchants.services import create_merchant
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
        f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/",
        "/admin/webhooks/webhookdelivery/",
        f"/admin/webhooks/webhookdelivery/{d.pk}/change/",
        "/admin/webhooks/event/",
        f"/admin/webhooks/event/{d.event_id}/change/",
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert secret not in response.content.decode()
    page = client.get(f"/admin/webhooks/webhookdelivery/{d.pk}/change/").content.decode()
    assert "told to fail" in page  # the attempts' excerpts are shown inline
    action = {"action": "resend_selected", "_selected_action": [d.pk]}
    client.post("/admin/webhooks/webhookdelivery/", action)
    d.refresh_from_db()
    assert d.state == DeliveryState.EXHAUSTED  # no permission: the action is not even offered
    staff.user_permissions.add(Permission.objects.get(codename="resend_webhookdelivery"))
    client.post("/admin/webhooks/webhookdelivery/", action)
    d.refresh_from_db()
    assert d.state == DeliveryState.PENDING
    assert LogEntry.objects.filter(object_id=str(d.pk), user=staff).count() == 1


def test_abandoned_events_are_re_driven_from_the_console_only_with_permission():
    merchant, _ = create_merchant("Acme")
    with transaction.atomic():
        event = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
    Event.objects.filter(pk=event.pk).update(fan_out="abandoned", fan_out_failures=5, fan_out_transient_failures=7)
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_event"))
    client = Client()
    client.force_login(staff)
    action = {"action": "redrive_selected", "_selected_action": [event.pk]}
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
    assert "Re-driven" in entry.change_message
    client.post("/admin/webhooks/event/", action)  # pending: skipped, nothing written
    assert LogEntry.objects.filter(object_id=event.pk).count() == 1
    assert fanout.drain_once().fanned_out == 1
