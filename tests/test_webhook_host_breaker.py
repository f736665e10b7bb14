"""A receiver host's breaker (webhooks/services/host_breakers.py) through the shipping loop
(``Worker.run_once``), a real receiver process and the real database: failed attempts open
it, its deliveries then defer without spending a rung, the probe closes it, and at the
deferral ceiling the attempt goes ahead so the ladder still ends a delivery."""

from __future__ import annotations

import ipaddress

import pytest
from django.db import connection, transaction

from jobs.models import Breaker, DeadLetter
from jobs.runner.worker import Worker
from merchants.services import create_merchant
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import WebhookDelivery
from webhooks.services import endpoints, fanout

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0,) * 6
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_BREAKER_FAILURES = 2
    settings.VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS = 60.0
    # One delivery per job run, so each run_once below is one attempt (a carried batch and
    # the breaker: tests/test_webhook_carrying.py).
    settings.VPAY_WEBHOOK_BATCH = 1


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def host_breaker() -> Breaker | None:
    """The one webhook host breaker these tests make (one merchant, one receiver)."""
    return Breaker.objects.filter(name__startswith="webhook_host:").first()


def failing_host_with_two_deliveries(receiver) -> list[int]:
    receiver.set_mode("/down", "status", status=500)
    merchant = create_merchant("Acme")[0]
    endpoints.create_endpoint(merchant, url=receiver.url("/down"), enabled_events=["*"])
    with transaction.atomic():
        for i in range(2):
            emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"})
    fanout.drain_once()
    return list(WebhookDelivery.objects.order_by("id").values_list("id", flat=True))


def run_due() -> int:
    """Run every deliver job due now, one at a time (a worker claims one per free executor)."""
    sql("UPDATE jobs SET run_at = now() WHERE kind = 'webhook_deliver'")
    due = sql("SELECT count(*) FROM jobs WHERE kind = 'webhook_deliver' AND run_at <= now()")[0][0]
    worker = Worker()
    return sum(worker.run_once() for _ in range(due))


def attempts() -> int:
    return sql("SELECT count(*) FROM webhook_delivery_attempts")[0][0]


def test_failed_attempts_open_the_hosts_breaker_and_its_deliveries_then_defer_without_a_rung(receiver):
    failing_host_with_two_deliveries(receiver)
    run_due()
    assert attempts() == 2 and host_breaker().state == "open" and "HTTP 500" in host_breaker().last_error
    run_due()
    assert attempts() == 2  # nothing sent, no attempt claimed
    assert sql("SELECT sum(attempts) FROM webhook_deliveries")[0][0] == 2  # no rung spent
    rows = sql("SELECT attempts, deferrals, last_error FROM jobs WHERE kind = 'webhook_deliver'")
    name = host_breaker().name
    assert all(a == 0 and d == 1 and f"{name} is open" in e for a, d, e in rows)
    assert len(receiver.received("/down")) == 2


def test_after_the_cool_down_the_probe_reaches_the_host_and_closes_the_breaker(receiver):
    failing_host_with_two_deliveries(receiver)
    run_due()
    assert host_breaker().state == "open"
    receiver.set_mode("/down", "ok")
    sql("UPDATE breakers SET opened_at = now() - interval '61 seconds'")
    run_due()
    assert host_breaker().state == "closed"
    assert sql("SELECT state, count(*) FROM webhook_deliveries GROUP BY 1") == [("succeeded", 2)]


def test_at_the_deferral_ceiling_the_attempt_goes_ahead_so_the_ladder_still_ends_the_delivery(receiver):
    failing_host_with_two_deliveries(receiver)
    run_due()
    assert host_breaker().state == "open"
    sql("UPDATE jobs SET deferrals = 100 WHERE kind = 'webhook_deliver'")
    run_due()
    assert DeadLetter.objects.count() == 0
    assert attempts() == 4  # both attempted despite the open breaker: two more rungs spent


def test_one_merchants_failures_open_no_breaker_for_another_merchant_on_the_same_host(receiver):
    # A shared receiver host (a SaaS inbox, a platform's hooks.example.com): one merchant
    # whose endpoint there fails, or who makes it fail on purpose, must not defer every
    # other merchant's deliveries to that host.
    receiver.set_mode("/down", "status", status=500)
    acme, globex = create_merchant("Acme")[0], create_merchant("Globex")[0]
    endpoints.create_endpoint(acme, url=receiver.url("/down"), enabled_events=["*"])
    endpoints.create_endpoint(globex, url=receiver.url("/up"), enabled_events=["*"])
    with transaction.atomic():
        for i in range(2):
            emit(acme, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"})
    fanout.drain_once()
    run_due()
    [opened] = Breaker.objects.filter(state="open")
    assert acme.pk in opened.name and f":127.0.0.1:{receiver.port}" in opened.name  # the merchant's, host and port

    with transaction.atomic():
        emit(globex, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_g", "object": "payment_intent"})
    fanout.drain_once()
    run_due()
    [theirs] = WebhookDelivery.objects.filter(endpoint__merchant=globex)
    assert theirs.state == "succeeded" and len(receiver.received("/up")) == 1
    assert WebhookDelivery.objects.filter(endpoint__merchant=acme, attempts=1).count() == 2  # Acme's still deferred


def test_the_breaker_is_keyed_on_the_port_too():
    from webhooks.services.host_breakers import breaker_named_for

    names = {
        breaker_named_for("acct_1", url)
        for url in ("https://hooks.example.com/a", "https://HOOKS.example.com:443/b", "http://hooks.example.com/c")
    }
    assert names == {"webhook_host:acct_1:hooks.example.com:443", "webhook_host:acct_1:hooks.example.com:80"}
    assert breaker_named_for("acct_1", "https://[2001:db8::1]:8443/") == "webhook_host:acct_1:[2001:db8::1]:8443"
    assert breaker_named_for("acct_2", "https://hooks.example.com/") != breaker_named_for(
        "acct_1", "https://hooks.example.com/"
    )


def test_the_migration_drops_the_breakers_keyed_on_the_host_alone():
    # A host-only breaker left open by the release before would be read by nobody and show
    # as open on /metrics (and its runbook's alert) for ever.
    from django.db.migrations.executor import MigrationExecutor

    def migrate(target=None):
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate([target] if target else executor.loader.graph.leaf_nodes())

    try:
        migrate(("webhooks", "0012_webhookdelivery_public_id"))
        sql(
            "INSERT INTO breakers (name, state, failures, version, opened_at, last_error, updated_at) VALUES"
            " ('webhook_host:hooks.example.com', 'open', 10, 1, now(), 'HTTP 500', now()),"
            " ('webhook_host:2001:db8::1', 'open', 10, 1, now(), 'HTTP 500', now()),"
            " ('webhook_host:acct_Q1w2E3r4:hooks.example.com:443', 'open', 10, 1, now(), 'HTTP 500', now()),"
            " ('rail:sandbox', 'open', 5, 1, now(), 'HTTP 503', now())"
        )
    finally:
        migrate()  # the latest of every app, 0013_drop_host_only_breakers included
    assert sorted(Breaker.objects.values_list("name", flat=True)) == [
        "rail:sandbox",
        "webhook_host:acct_Q1w2E3r4:hooks.example.com:443",
    ]
