"""The admin overview (vpay/overview) through Django's test client: the numbers it shows for
a known last hour, each window on the database clock; who may see it; and its chart layout,
which is pure geometry."""

from __future__ import annotations

import pytest
from django.urls import reverse

from charges.models import Charge, PaymentIntent
from jobs.adapters import postgres as queue
from jobs.services import dead_letters as ops
from merchants.services import create_merchant
from tests.factories.jobs import DeadLetterFactory
from tests.ops_support import staff_user
from tests.queue_support import claim, execute, task_payload
from tests.test_webhook_admin import deliveries_in
from vpay.overview import charts, sql
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def attempts(delivery_id: int, *states_minutes_ago: tuple[str, float]) -> None:
    for number, (state, minutes) in enumerate(states_minutes_ago, 1):
        execute(
            "INSERT INTO webhook_delivery_attempts (delivery_id, number, lease_token, state, started_at)"
            " VALUES (%s, %s, gen_random_uuid(), %s, now() - make_interval(secs => %s))",
            [delivery_id, number, state, minutes * 60],
        )


def charge(merchant, status: str, unresolved_minutes_ago: float | None = None) -> Charge:
    intent = PaymentIntent.objects.create(merchant=merchant, amount=1000, currency="EUR", rail="sandbox_push")
    made = Charge.objects.create(
        intent=intent, merchant=merchant, rail="sandbox_push", flow="push", amount=1000, currency="EUR", status=status
    )
    if unresolved_minutes_ago is not None:
        execute(
            "UPDATE charges SET unresolved_at = now() - make_interval(secs => %s) WHERE id = %s",
            [unresolved_minutes_ago * 60, made.pk],
        )
    return made


@pytest.fixture
def last_hour():
    """A known hour: 3 claimable tasks (the oldest due 2h 3m ago), 1 scheduled, 1 running;
    an endpoint that succeeds and fails, one that only fails, one that failed 2 hours ago;
    2 unresolved charges (one new) and a live one; 2 pending dead letters (one new) and a
    discarded one."""
    for _ in range(3):
        queue.enqueue("task", task_payload())
    execute("UPDATE jobs SET run_at = now() - interval '2 hours 3 minutes' WHERE id = (SELECT min(id) FROM jobs)")
    queue.enqueue("task", task_payload(), delay=3600)
    queue.enqueue("sweep_expired", {}, queue="maintenance")
    claim(queues=("maintenance",))

    fine, failing, old = (deliveries_in(["pending"], name)[0] for name in ("Fine", "Failing", "Old"))
    attempts(fine, ("failed", 20), ("succeeded", 7), ("succeeded", 2))
    attempts(failing, ("failed", 50), ("no_response", 30), ("failed", 7))
    attempts(old, ("failed", 130))
    execute("DELETE FROM jobs WHERE kind = 'webhook_deliver'")  # not this test's queue
    endpoint = WebhookDelivery.objects.get(pk=failing).endpoint
    endpoint.url = "https://user:s3cr3t@hooks.failing.example:8443/secret-path?key=abc"
    endpoint.save(update_fields=["url"])

    merchant, _ = create_merchant("Payer")
    charge(merchant, "unresolved", unresolved_minutes_ago=10)
    charge(merchant, "unresolved", unresolved_minutes_ago=180)
    charge(merchant, "submitted")

    DeadLetterFactory()
    old_letter = DeadLetterFactory(kind="sweep_expired")
    execute("UPDATE dead_letters SET created_at = now() - interval '2 hours' WHERE id = %s", [old_letter.pk])
    ops.dead_letter_discard(letter_id=DeadLetterFactory().pk, actor="ops", reason="noise")
    return {"failing_endpoint": endpoint.pk}


def test_the_overview_shows_the_last_hour_from_the_database(client, last_hour, operator):
    page = client.get(reverse("admin-overview"))
    assert page.status_code == 200
    totals = page.context["totals"]
    assert totals == {
        "claimable": 3,
        "scheduled": 1,
        "leased": 1,
        "oldest": "2h 3m",
        "succeeded": 2,
        "failed": 4,  # the one two hours ago is outside the window
        "failing_endpoints": 1,  # "Fine" also succeeded; "Old" failed before the window
        "unresolved": 2,
        "unresolved_new": 1,
        "pending": 2,
        "pending_new": 1,
    }
    body = page.content.decode()
    assert '<strong id="total-claimable">3</strong>' in body
    assert '<strong id="dead-letters-pending">2</strong>' in body
    assert f"{last_hour['failing_endpoint']} (hooks.failing.example:8443)" in body
    assert "s3cr3t" not in body and "secret-path" not in body and "key=abc" not in body  # the host only
    assert body.count('<svg class="vpay-chart"') == 7  # every chart has something to draw
    assert "<script" not in body.split('id="content-main"')[1]  # drawn server-side, no script


def test_each_attempt_lands_in_its_five_minute_bucket_on_the_database_clock(last_hour):
    buckets = sql.attempts_by_bucket()
    assert len(buckets) == sql.BUCKETS
    # 2 minutes ago: the newest bucket; 7: the one before; 20, 30, 50: 4, 6 and 10 back.
    assert buckets[-1] == (1, 0)
    assert buckets[-2] == (1, 1)
    assert buckets[-4] == (0, 1) and buckets[-6] == (0, 1) and buckets[-10] == (0, 1)
    assert sum(ok + failed for ok, failed in buckets) == 6
    assert sql.new_dead_letters_by_bucket()[-1] == 1


def test_the_overview_needs_the_jobs_view_permission_and_the_index_links_to_it(client, django_user_model, operator):
    client.force_login(staff_user(django_user_model, "vera", "view_deadletter"))
    assert client.get(reverse("admin-overview")).status_code == 403
    assert b'id="overview-link"' not in client.get(reverse("admin:index")).content
    client.force_login(operator)
    index = client.get(reverse("admin:index")).content.decode()
    assert f'<a href="{reverse("admin-overview")}">The last hour, in charts</a>' in index
    client.logout()
    assert client.get(reverse("admin-overview")).status_code == 302  # to the admin's login


def test_an_empty_system_draws_empty_charts_saying_so(client, operator):
    body = client.get(reverse("admin-overview")).content.decode()
    assert "The queue is empty." in body and "No charge is unresolved." in body


def test_bar_chart_geometry():
    chart = charts.bar_chart(
        [("a", [2, 0, 2], "4"), ("b", [1, 1, 0], "2"), ("c", [0, 0, 0], "0")],
        [("x", "red"), ("y", "blue"), ("z", "grey")],
        width=400,
        label_width=100,
        text_width=100,
    )
    a, b, c = chart.bars
    assert [(s.x, s.width, s.series) for s in a.segments] == [(100, 100, "x"), (200, 100, "z")]  # the longest spans
    assert [(s.x, s.width) for s in b.segments] == [(100, 50), (150, 50)]
    assert c.segments == []  # a zero draws nothing
    assert (a.y, b.y, c.y, chart.height) == (0, 26, 52, 70)
    assert charts.bar_chart([], [("x", "red")]).bars == []


def test_column_chart_geometry():
    chart = charts.column_chart(
        [[0, 0], [2, 2], [1, 0], [0, 3]], [("ok", "g"), ("bad", "r")], bucket_seconds=300, width=440, height=130
    )
    assert chart.top_value == 4 and (chart.plot_top, chart.plot_bottom) == (8, 108)
    empty, full, half, bad = chart.columns
    assert empty == []
    assert [(s.y, s.height, s.series) for s in full] == [(58, 50, "ok"), (8, 50, "bad")]  # stacked to the top
    assert [(s.y, s.height) for s in half] == [(83, 25)]
    assert [(s.y, s.height) for s in bad] == [(33, 75)]
    assert [text for _, text in chart.ticks] == ["-20 min", "-15 min", "-10 min", "-5 min", "now"]
