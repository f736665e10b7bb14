"""Webhook delivery through real ``runworker`` processes and a real receiver process:
end to end with rotation, the ladder to ``exhausted``, SIGKILL mid-backlog, and a slow
endpoint at its cap beside a fast one. Judged by the database, the receiver's own record
and the worker's log; no mocks."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from django.db import connection, transaction

from jobs.models import Alert
from merchants.services import create_merchant
from sandbox.receiver import fingerprint
from tests.conftest import wait_for
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services import endpoints
from webhooks.ssrf import parse_cidrs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_ENV = {
    "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
    "VPAY_WEBHOOK_FAN_OUT_IDLE": "0.5",
    "VPAY_WEBHOOK_SCAN_PERIOD": "2",
    "VPAY_WEBHOOK_CONNECT_TIMEOUT": "1",
    "VPAY_WEBHOOK_TIMEOUT": "2",
    "VPAY_WEBHOOK_LEASE_SECONDS": "4",
}


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs(BASE_ENV["VPAY_WEBHOOK_ALLOW_CIDRS"])


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def states() -> Counter:
    return Counter(dict(sql("SELECT state, count(*) FROM webhook_deliveries GROUP BY state")))


def emit_many(merchant, n, type_=EventType.PAYMENT_INTENT_SUCCEEDED) -> list[str]:
    with transaction.atomic():
        return [emit(merchant, type_, {"id": f"pi_{i}", "object": "payment_intent"}).pk for i in range(n)]


def log_records(worker) -> list[dict]:
    out = []
    for line in worker.output().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_end_to_end_every_subscribed_endpoint_gets_each_event_once_verifiable_with_each_active_secret(
    receiver, start_worker
):
    merchant, _ = create_merchant("Acme")
    rotating, old_secret = endpoints.create_endpoint(merchant, url=receiver.url("/a"), enabled_events=["*"])
    new_secret = endpoints.rotate_secret(rotating)  # mid-rotation: both sign
    _, typed_secret = endpoints.create_endpoint(
        merchant, url=receiver.url("/b"), enabled_events=["payment_intent.succeeded"]
    )
    endpoints.create_endpoint(merchant, url=receiver.url("/c"), enabled_events=["customer.deleted"])
    receiver.add_secrets(old_secret, new_secret, typed_secret)
    events = emit_many(merchant, 5)

    worker = start_worker("--concurrency", "4", env=BASE_ENV)
    wait_for(lambda: states()[DeliveryState.SUCCEEDED] == 10, timeout=60, message="10 deliveries to succeed")

    got = receiver.received()
    by_path = {path: sorted(r["event_id"] for r in got if r["path"] == path) for path in ("/a", "/b", "/c")}
    assert by_path == {"/a": sorted(events), "/b": sorted(events), "/c": []}  # each once, nothing unsubscribed
    for r in got:
        assert r["verified"] and r["type"] == "payment_intent.succeeded" and r["attempt"] == "1"
        expected = (
            [fingerprint(old_secret), fingerprint(new_secret)] if r["path"] == "/a" else [fingerprint(typed_secret)]
        )
        assert sorted(r["verified_by"]) == sorted(expected)
    assert worker.proc.poll() is None


def test_500s_timeouts_drops_and_redirects_ride_the_ladder_to_exhausted_with_one_alert_each(receiver, start_worker):
    merchant, _ = create_merchant("Acme")
    paths = {
        "/fail": "?mode=status&status=500",
        "/hang": "?mode=hang&delay=30",
        "/drop": "?mode=drop",
        "/moved": "?mode=redirect",
    }
    for path, query in paths.items():
        endpoints.create_endpoint(merchant, url=receiver.url(path + query), enabled_events=["*"])
    emit_many(merchant, 1)

    worker = start_worker("--concurrency", "4", env={**BASE_ENV, "VPAY_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2"})
    wait_for(lambda: states()[DeliveryState.EXHAUSTED] == 4, timeout=90, message="4 deliveries to exhaust")

    rows = sql(
        "SELECT e.url, a.number, a.state, a.status_code, a.error <> '' FROM webhook_delivery_attempts a"
        " JOIN webhook_deliveries d ON d.id = a.delivery_id JOIN webhook_endpoints e ON e.id = d.endpoint_id"
        " ORDER BY e.url, a.number"
    )
    by_path: dict[str, list] = {}
    for url, number, state, status, has_error in rows:
        by_path.setdefault(url.split("?")[0].rsplit("/", 1)[1], []).append((number, state, status, has_error))
    # One attempt row per try; a heard refusal has its status, no answer has NULL and a cause.
    assert by_path["fail"] == [(n, "failed", 500, False) for n in (1, 2, 3)]
    assert by_path["moved"] == [(n, "failed", 302, False) for n in (1, 2, 3)]
    assert by_path["hang"] == [(n, "no_response", None, True) for n in (1, 2, 3)]
    assert by_path["drop"] == [(n, "no_response", None, True) for n in (1, 2, 3)]
    # The receiver saw three tries of each; the redirect target was never requested.
    assert Counter(r["path"] for r in receiver.received()) == {"/fail": 3, "/hang": 3, "/drop": 3, "/moved": 3}
    # One alert per endpoint (each has one exhausted delivery: the period's first), logged
    # once by the worker (jobs.operator.alerts' send_alert job).
    expected = sorted(Alert.objects.values_list("key", flat=True))
    assert sorted(k.rsplit(":", 1)[0] for k in expected) == sorted(
        f"webhook_endpoint_exhausted:{d.endpoint_id}" for d in WebhookDelivery.objects.all()
    )
    wait_for(lambda: not Alert.objects.filter(logged_at__isnull=True).exists(), message="the alerts to be logged")
    worker.signal()
    worker.wait(timeout=30)
    logged = [
        r for r in log_records(worker) if r.get("alert") is True and r.get("source") == "webhooks.delivery_exhausted"
    ]
    assert sorted(r["alert_key"] for r in logged) == expected


def test_sigkill_during_a_backlog_of_1000_deliveries_a_replacement_finishes_with_no_gaps(receiver, start_worker):
    merchant, _ = create_merchant("Acme")
    paths = [f"/ep{i}" for i in range(4)]
    for path in paths:
        # A little slow, so the kill lands while attempts are in flight.
        endpoints.create_endpoint(merchant, url=receiver.url(path + "?mode=slow&delay=0.02"), enabled_events=["*"])
    events = emit_many(merchant, 250)  # x 4 endpoints = 1000 deliveries
    args = ("--concurrency", "8", "--heartbeat", "1")

    doomed = start_worker(*args, "--worker-id", "doomed", env=BASE_ENV)
    wait_for(
        lambda: sql("SELECT count(*) FROM webhook_deliveries")[0][0] == 1000 and len(receiver.received()) >= 250,
        timeout=90,
        message="the backlog fanned out and a quarter of it delivered",
    )
    # Killed while attempts are in flight (each lasts the receiver's 20 ms at least): with
    # grouped claims there are instants with none, and a kill there would prove nothing here.
    wait_for(
        lambda: sql("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'")[0][0] > 0,
        timeout=30,
        interval=0.001,
        message="an attempt in flight",
    )
    doomed.kill()
    in_flight_at_kill = sql("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'")[0][0]
    assert states()[DeliveryState.SUCCEEDED] < 1000

    start_worker(*args, "--worker-id", "replacement", env=BASE_ENV)
    wait_for(lambda: states()[DeliveryState.SUCCEEDED] == 1000, timeout=180, message="all 1000 deliveries")

    assert states() == {DeliveryState.SUCCEEDED: 1000}
    received = receiver.received()
    # A request the kill cut off mid-send reaches the receiver without a whole body (no event
    # id to read): only an attempt in flight at the kill can have sent one.
    cut_off = [r for r in received if r["event_id"] is None]
    assert len(cut_off) <= in_flight_at_kill, cut_off
    receipts = Counter((r["path"], r["event_id"]) for r in received if r["event_id"] is not None)
    assert set(receipts) == {(p, e) for p in paths for e in events}  # every event id, every endpoint
    assert all(r["verified"] is False for r in receiver.received())  # (the receiver was given no secret)
    # Duplicates are only re-sends of the same event id, by a delivery whose earlier attempt
    # was cut off by the kill (abandoned) or finished too late (stale).
    resent = {
        (url.split("?")[0].rsplit("/", 1)[1], event_id)
        for url, event_id in sql(
            "SELECT e.url, d.event_id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id"
            " WHERE EXISTS (SELECT 1 FROM webhook_delivery_attempts a WHERE a.delivery_id = d.id"
            " AND a.state IN ('abandoned', 'stale'))"
        )
    }
    for (path, event_id), n in receipts.items():
        if n > 1:
            assert (path.lstrip("/"), event_id) in resent and n == 2, (path, event_id, n)
    # Exactly one succeeded attempt per delivery, and the kill did cut attempts off mid-flight.
    assert sql(
        "SELECT count(*) FROM webhook_deliveries d WHERE (SELECT count(*) FROM webhook_delivery_attempts a"
        " WHERE a.delivery_id = d.id AND a.state = 'succeeded') <> 1"
    ) == [(0,)]
    assert in_flight_at_kill > 0
    assert sql("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'") == [(0,)]


def test_a_slow_endpoint_does_not_delay_a_fast_one_with_the_default_cap_and_concurrency(receiver, start_worker):
    """The default global cap (8) is above the default worker's 4 executors: what keeps
    threads free for the fast endpoint is the per-worker share (half the threads)."""
    merchant, _ = create_merchant("Acme")
    slow, _ = endpoints.create_endpoint(
        merchant, url=receiver.url("/slow?mode=slow&delay=8"), enabled_events=[EventType.PAYMENT_INTENT_SUCCEEDED]
    )
    fast, _ = endpoints.create_endpoint(
        merchant, url=receiver.url("/fast"), enabled_events=[EventType.PAYMENT_INTENT_PAYMENT_FAILED]
    )
    emit_many(merchant, 6)  # for the slow endpoint only: 8 s per answer
    env = {**BASE_ENV, "VPAY_WEBHOOK_TIMEOUT": "10", "VPAY_WEBHOOK_LEASE_SECONDS": "20"}
    assert "VPAY_WEBHOOK_MAX_IN_FLIGHT" not in env
    start_worker("--concurrency", "4", env=env)

    def slow_in_flight():
        return WebhookDelivery.objects.filter(endpoint=slow, state=DeliveryState.DELIVERING).count()

    def slow_executors() -> int:
        """The worker's executors held by the slow endpoint: jobs leased whose delivery is
        being sent (a carried delivery's job is held, not leased: its send rides on its
        carrier's executor; a job that runs a moment only to find its endpoint at the share
        leaves its delivery pending)."""
        return sql(
            "SELECT count(*) FROM jobs j JOIN webhook_deliveries d ON j.dedupe_key = 'webhook_deliver:' || d.id"
            " WHERE d.endpoint_id = %s AND j.locked_at IS NOT NULL AND d.state = 'delivering'",
            [slow.pk],
        )[0][0]

    wait_for(lambda: slow_in_flight() >= 2, timeout=30, message="slow sends in flight")
    # Ample for the other two threads to take the slow endpoint's jobs too, were they allowed to.
    executors = []
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        executors.append(slow_executors())
        time.sleep(0.05)
    assert 1 <= max(executors) <= 2, executors  # the worker's share: 2 of its 4 executors
    emit_many(merchant, 4, EventType.PAYMENT_INTENT_PAYMENT_FAILED)
    wait_for(
        lambda: WebhookDelivery.objects.filter(endpoint=fast, state=DeliveryState.SUCCEEDED).count() == 4,
        timeout=60,
        message="the fast endpoint's deliveries",
    )
    # Each fast delivery's own latency, from its event's commit to its success, on the
    # database clock. Behind the slow sends it would be most of their 8 s; the bound is
    # half that, which leaves a loaded machine seconds of slack.
    latencies = [
        seconds
        for (seconds,) in sql(
            "SELECT EXTRACT(EPOCH FROM d.completed_at - e.created_at)::float8 FROM webhook_deliveries d"
            " JOIN events e ON e.id = d.event_id WHERE d.endpoint_id = %s",
            [fast.pk],
        )
    ]
    assert len(latencies) == 4 and max(latencies) < 4.0, latencies
    # The share keeps the worker's executors (2 of 4 may run the slow endpoint's jobs); the
    # sends those jobs carry (webhooks.services.carrying) are bounded by the endpoint's cap.
    [(most,)] = sql(
        "SELECT coalesce(max(n), 0) FROM (SELECT (SELECT count(*) FROM webhook_delivery_attempts b"
        " JOIN webhook_deliveries db ON db.id = b.delivery_id WHERE db.endpoint_id = %s"
        " AND b.started_at <= a.started_at AND coalesce(b.finished_at, 'infinity') > a.started_at) AS n"
        " FROM webhook_delivery_attempts a JOIN webhook_deliveries da ON da.id = a.delivery_id"
        " WHERE da.endpoint_id = %s) per_attempt",
        [slow.pk, slow.pk],
    )
    assert 1 <= most <= 8
