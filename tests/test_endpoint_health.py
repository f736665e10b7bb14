"""Endpoint health: the streak read on the database clock, the warning, the disable, the
held deliveries, and re-enabling from the API and the ops console."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client

from jobs.models import Alert
from merchants.services import create_merchant
from tests.api_support import MerchantClient
from tests.retention_support import DAY, MINUTE, age, event, sql
from tests.retention_support import endpoint as new_endpoint
from webhooks import health_sql, repository
from webhooks.health_decisions import Verdict
from webhooks.models import DeliveryAttempt, Event, WebhookDelivery, WebhookEndpoint
from webhooks.services import delivery as delivery_service
from webhooks.services import fanout
from webhooks.services.endpoint_health import check_endpoint, endpoint_disable, endpoint_enable

pytestmark = pytest.mark.django_db(transaction=True)

HALF = 2.5 * DAY
FAIL, NO_ANSWER, OK = ("failed", 500), ("no_response", None), ("succeeded", 200)


@pytest.fixture
def merchant():
    return create_merchant("Health")[0]


def endpoint(merchant, name: str = "a") -> WebhookEndpoint:
    """An endpoint whose health record began 30 days ago (so earlier attempts can count)."""
    ep = new_endpoint(merchant, name)
    age("webhook_endpoints", "health_since", ep.pk, 30 * DAY)
    return ep


def tried(ep, *attempts: tuple[tuple[str, int | None], float]) -> int:
    """One delivery to ``ep`` with these attempts: ((state, status_code), seconds ago)."""
    made = WebhookDelivery.objects.create(event_id=event(ep.merchant), endpoint=ep, state="pending")
    for number, ((state, status), seconds_ago) in enumerate(attempts, start=1):
        row = DeliveryAttempt.objects.create(
            delivery=made, number=number, lease_token=uuid.uuid4(), state=state, status_code=status
        )
        age("webhook_delivery_attempts", "started_at", row.pk, seconds_ago)
    WebhookDelivery.objects.filter(pk=made.pk).update(attempts=len(attempts))
    return made.pk


def warned(ep, seconds_ago: float) -> None:
    age("webhook_endpoints", "health_warned_at", ep.pk, seconds_ago)


def events_of(type_: str) -> list[dict]:
    return list(Event.objects.filter(type=type_).order_by("created_at").values_list("data", flat=True))


def test_failing_for_half_the_window_warns_the_other_endpoints_and_alerts_once(merchant):
    failing, other = endpoint(merchant, "failing"), endpoint(merchant, "other")
    tried(failing, (FAIL, HALF + MINUTE), (NO_ANSWER, 0))
    assert check_endpoint(failing.pk) is Verdict.WARN
    [warning] = events_of("webhook_endpoint.failing")
    assert warning["id"] == failing.pk and warning["status"] == "enabled"
    fanout.drain_once()
    event_id = sql("SELECT id FROM events WHERE type = 'webhook_endpoint.failing'")[0][0]
    # To the merchant's other endpoints only: the failing one would not hear it.
    assert list(WebhookDelivery.objects.filter(event_id=event_id).values_list("endpoint_id", flat=True)) == [other.pk]
    assert Alert.objects.filter(source="webhooks.endpoint_failing").count() == 1
    assert check_endpoint(failing.pk) is None  # once per streak
    streak = health_sql.current_streak(failing.pk, 10 * DAY)
    assert health_sql.mark_warned(failing.pk, streak.first_at) is None  # and the statement says so too
    assert len(events_of("webhook_endpoint.failing")) == 1


def test_failing_for_just_under_half_the_window_is_left_alone(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, HALF - MINUTE), (FAIL, 0))
    assert check_endpoint(ep.pk) is None
    assert events_of("webhook_endpoint.failing") == []


def test_failing_for_the_window_and_warned_half_a_window_ago_is_disabled_with_a_reason(merchant):
    ep, other = endpoint(merchant, "a"), endpoint(merchant, "b")
    tried(ep, (FAIL, 5 * DAY + MINUTE), (FAIL, 0))
    warned(ep, HALF + MINUTE)
    assert check_endpoint(ep.pk) is Verdict.DISABLE
    ep.refresh_from_db()
    assert ep.disabled_at is not None and ep.disabled_by == "vpay" and "failed for 5.0 days" in ep.disabled_reason
    [disabled] = events_of("webhook_endpoint.disabled")
    assert disabled["status"] == "disabled" and disabled["disabled_reason"] == ep.disabled_reason
    assert Alert.objects.filter(source="webhooks.endpoint_disabled").count() == 1
    fanout.drain_once()  # the disabled endpoint gets neither this event nor any new one
    assert set(
        WebhookDelivery.objects.filter(event__type="webhook_endpoint.disabled").values_list("endpoint_id", flat=True)
    ) == {other.pk}


def test_a_warning_younger_than_half_a_window_holds_the_disable_back(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, 6 * DAY), (FAIL, 0))
    warned(ep, HALF - MINUTE)
    assert check_endpoint(ep.pk) is None
    # The statement itself refuses too (a verdict read before a re-warning, say).
    streak = health_sql.current_streak(ep.pk, 10 * DAY)
    assert health_sql.disable_failing(ep.pk, streak.first_at, half_window_seconds=HALF, reason="x") is None
    ep.refresh_from_db()
    assert ep.disabled_at is None


def test_a_span_just_short_of_the_window_is_not_disabled(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, 5 * DAY - MINUTE), (FAIL, 0))
    warned(ep, 3 * DAY)
    assert check_endpoint(ep.pk) is None


def test_a_success_starts_the_streak_over(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, 6 * DAY), (FAIL, 4 * DAY), (OK, DAY), (FAIL, 0))
    streak = health_sql.current_streak(ep.pk, 10 * DAY)
    assert streak is not None and streak.span_seconds < MINUTE  # only the failure after the success
    assert check_endpoint(ep.pk) is None


def test_only_the_receivers_failures_count(merchant):
    ep = endpoint(merchant)
    # Nothing left (no secret, SSRF: no status code) or our worker died: not the receiver.
    tried(ep, (("failed", None), 6 * DAY), (("abandoned", None), 5 * DAY), (("stale", None), 4 * DAY), (FAIL, 0))
    assert check_endpoint(ep.pk) is None


def test_failures_before_a_re_enable_do_not_count(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, 6 * DAY), (FAIL, 0))
    age("webhook_endpoints", "health_since", ep.pk, DAY)
    streak = health_sql.current_streak(ep.pk, 10 * DAY)
    assert streak is not None and streak.span_seconds < MINUTE
    assert check_endpoint(ep.pk) is None
    # A streak read before the re-enable is refused by the statement itself.
    [(before,)] = sql("SELECT now() - interval '6 days'")
    assert health_sql.mark_warned(ep.pk, before) is None


def test_the_disable_rechecks_in_its_statement_that_nothing_succeeded_since_the_streak_began(merchant):
    ep = endpoint(merchant)
    tried(ep, (FAIL, 6 * DAY), (FAIL, 0))
    warned(ep, 3 * DAY)
    streak = health_sql.current_streak(ep.pk, 10 * DAY)
    assert streak is not None and streak.span_seconds >= 5 * DAY
    tried(ep, (OK, 0))  # a success lands between the read and the write
    assert health_sql.disable_failing(ep.pk, streak.first_at, half_window_seconds=HALF, reason="x") is None
    assert health_sql.mark_warned(ep.pk, streak.first_at) is None


def test_a_disabled_endpoint_holds_its_pending_deliveries_and_re_enabling_resumes_them(merchant):
    ep = endpoint(merchant)
    held = tried(ep)
    assert endpoint_disable(endpoint_id=ep.pk, reason="maintenance", actor="merchant")
    begun = delivery_service.begin_attempt(held)
    assert begun.kind is delivery_service.Begin.HELD
    assert DeliveryAttempt.objects.filter(delivery_id=held).count() == 0
    assert WebhookDelivery.objects.get(pk=held).state == "pending"
    age("webhook_deliveries", "next_attempt_at", held, 3600)
    assert repository.due_deliveries(100, 30) == []  # held, not lost: the backstop leaves it
    age("webhook_deliveries", "next_attempt_at", held, -5 * 3600)  # its next rung was hours away
    assert endpoint_enable(endpoint_id=ep.pk, actor="merchant") == 1
    assert sql("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [delivery_service.dedupe_key(held)])[0][0] == 1
    assert delivery_service.begin_attempt(held).kind is delivery_service.Begin.CLAIMED
    ep.refresh_from_db()
    assert ep.disabled_at is None and ep.health_warned_at is None and ep.disabled_reason == ""


def test_re_enabling_makes_a_held_deliverys_job_waiting_for_a_later_rung_due_now(merchant):
    from jobs.adapters import postgres as queue
    from jobs.kinds import JobKind
    from tests.queue_support import seconds_until_run

    ep = endpoint(merchant)
    held = tried(ep)
    job_id = queue.enqueue(
        JobKind.WEBHOOK_DELIVER, {"delivery_id": held}, dedupe_key=delivery_service.dedupe_key(held), delay=3600
    )
    assert endpoint_disable(endpoint_id=ep.pk, reason="maintenance", actor="merchant")
    assert endpoint_enable(endpoint_id=ep.pk, actor="merchant") == 1
    # Its job was already there (the enqueue made none): pulled forward, after the commit.
    assert sql("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [delivery_service.dedupe_key(held)])[0][0] == 1
    assert seconds_until_run(job_id) == pytest.approx(0, abs=0.5)


def test_a_disabled_endpoint_gets_no_new_deliveries(merchant):
    ep, other = endpoint(merchant, "a"), endpoint(merchant, "b")
    endpoint_disable(endpoint_id=ep.pk, reason="maintenance", actor="merchant")
    later = event(merchant, fan_out="pending")
    fanout.drain_once()
    assert list(WebhookDelivery.objects.filter(event_id=later).values_list("endpoint_id", flat=True)) == [other.pk]


def test_the_merchant_disables_and_re_enables_over_the_api():
    acme = MerchantClient("Acme")
    ep = acme.call("POST", "/v1/webhook_endpoints", {"url": "https://hooks.example.com/x", "enabled_events": ["*"]})
    endpoint_id = ep.json()["id"]
    response = acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/disable", {"reason": "x" * 301})
    assert response.status_code == 400 and response.json()["error"]["param"] == "reason"
    response = acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/disable", {"reason": "moving servers"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "disabled" and response.json()["disabled_reason"] == "moving servers"
    again = acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/disable")
    assert again.status_code == 200 and again.json()["disabled_reason"] == "moving servers"  # unchanged
    assert len(events_of("webhook_endpoint.disabled")) == 1
    response = acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/enable")
    assert response.status_code == 200 and response.json()["status"] == "enabled"
    assert response.json()["disabled_reason"] is None
    assert acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/enable", {"x": 1}).json()["error"]["code"] == (
        "parameter_unknown"
    )
    acme.call("DELETE", f"/v1/webhook_endpoints/{endpoint_id}")
    gone = acme.call("POST", f"/v1/webhook_endpoints/{endpoint_id}/enable")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "resource_missing"


def test_an_operator_re_enables_in_two_steps_with_a_reason_and_only_with_permission(merchant):
    ep = endpoint(merchant)
    endpoint_disable(endpoint_id=ep.pk, reason="failing", actor="vpay")
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_webhookendpoint"))
    client = Client()
    client.force_login(staff)
    action = {"action": "enable_selected", "_selected_action": [ep.pk]}
    client.post("/admin/webhooks/webhookendpoint/", {**action, "post": "yes", "reason": "fixed"})
    assert WebhookEndpoint.objects.get(pk=ep.pk).disabled_at is not None  # no permission, no action
    staff.user_permissions.add(Permission.objects.get(codename="disable_webhookendpoint"))
    form = client.post("/admin/webhooks/webhookendpoint/", action)
    assert form.status_code == 200 and b"Reason (required)" in form.content
    blank = client.post("/admin/webhooks/webhookendpoint/", {**action, "post": "yes", "reason": "  "})
    assert blank.status_code == 400 and WebhookEndpoint.objects.get(pk=ep.pk).disabled_at is not None
    client.post("/admin/webhooks/webhookendpoint/", {**action, "post": "yes", "reason": "merchant fixed TLS"})
    assert WebhookEndpoint.objects.get(pk=ep.pk).disabled_at is None
    entry = LogEntry.objects.get(object_id=ep.pk, user=staff)
    assert "merchant fixed TLS" in entry.change_message
    page = client.get(f"/admin/webhooks/webhookendpoint/{quote(ep.pk)}/change/")
    assert page.status_code == 200 and b"health since" in page.content.lower()
