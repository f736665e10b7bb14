"""Breaker state where operators look: ``/metrics`` (the web process's, through Django's test
client, and the gauges the worker serves) and the admin's read-only Breakers list."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse
from prometheus_client import REGISTRY, generate_latest

from jobs.primitives import breaker_gauges, breakers
from jobs.primitives.breakers import Limits
from tests.ops_support import staff_user

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = Limits(failures=2, cool_down=60.0, probe_lease=30.0)


def fail(name: str, times: int) -> None:
    for _ in range(times):
        breakers.failed(breakers.admit(name, LIMITS), "RailUnavailable: HTTP 503")


def test_metrics_show_every_rails_breaker_and_every_host_breaker_that_is_not_closed(client):
    fail("rail:momo", 2)  # open
    fail("rail:card", 1)  # closed, one failure: a rail is always shown
    fail("webhook_host:down.example", 2)  # open
    fail("webhook_host:flaky.example", 1)  # closed: not a gauge of its own
    body = client.get("/metrics").content.decode()
    assert 'vpay_breaker_state{breaker="rail:momo"} 2.0' in body
    assert 'vpay_breaker_state{breaker="rail:card"} 0.0' in body
    assert 'vpay_breaker_state{breaker="webhook_host:down.example"} 2.0' in body
    assert "flaky.example" not in body
    assert 'vpay_breakers{family="webhook_host",state="closed"} 1.0' in body
    assert 'vpay_breakers{family="rail",state="open"} 1.0' in body


def test_the_gauges_follow_a_breaker_that_closes_and_forget_one_that_went_quiet():
    fail("webhook_host:back.example", 2)
    breaker_gauges.refresh()
    assert 'vpay_breaker_state{breaker="webhook_host:back.example"} 2.0' in generate_latest(REGISTRY).decode()
    with connection.cursor() as cursor:  # the cool-down is over
        cursor.execute("UPDATE breakers SET opened_at = now() - interval '61 seconds'")
    breakers.succeeded(breakers.admit("webhook_host:back.example", LIMITS))  # the probe answers
    breaker_gauges.refresh()  # what the worker's gauge refresh calls
    assert "back.example" not in generate_latest(REGISTRY).decode()


def test_the_admin_lists_breakers_open_first_with_their_age_and_last_error(client, django_user_model):
    fail("rail:card", 1)
    fail("rail:momo", 2)
    client.force_login(staff_user(django_user_model, "olga", "view_breaker"))
    response = client.get(reverse("admin:jobs_breaker_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    assert page.index("rail:momo") < page.index("rail:card")  # open first
    assert "RailUnavailable: HTTP 503" in page
    rows = list(response.context["cl"].result_list)
    assert [(b.name, b.state) for b in rows] == [("rail:momo", "open"), ("rail:card", "closed")]


def test_the_breakers_list_is_read_only(client, django_user_model):
    fail("rail:momo", 2)
    client.force_login(staff_user(django_user_model, "olga", "view_breaker"))
    change = client.post(reverse("admin:jobs_breaker_change", args=["rail:momo"]), {"state": "closed"})
    assert change.status_code == 403
    assert client.get(reverse("admin:jobs_breaker_add")).status_code == 403
