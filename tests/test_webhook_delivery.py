"""Fan-out, the three delivery steps, fencing, the cap and the backstop, in-process against
the real database and a real receiver process. The worker process tests are in
test_webhook_worker.py."""

from __future__ import annotations

import contextlib
import ipaddress
import json

import pytest
from django.db import connection, transaction

from jobs.models import Alert
from jobs.operator.alerts import admin_change_path
from merchants.services import create_merchant
from sandbox.receiver import fingerprint
from webhooks import repository
from webhooks.event_types import EventType
from webhooks.events import emit, render_event
from webhooks.models import AttemptState, DeliveryAttempt, DeliveryState, Event, WebhookDelivery
from webhooks.services import delivery, endpoints, fanout, scan
from webhooks.signing import signature_header, verify

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0)  # three tries; no waiting between them
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_LEASE_SECONDS = 30.0


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


@contextlib.contextmanager
def delivery_insert_trigger(name, body):
    """A real database failure on ``webhook_deliveries`` inserts for the duration: a
    ``BEFORE INSERT`` trigger running the PL/pgSQL ``body`` (it ends in ``RETURN NEW;``
    or raises), dropped on exit."""
    sql(f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN {body} END $$ LANGUAGE plpgsql")
    sql(f"CREATE TRIGGER {name} BEFORE INSERT ON webhook_deliveries FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        yield
    finally:
        sql(f"DROP TRIGGER {name} ON webhook_deliveries")


REFUSE_EVERY_INSERT = "RAISE EXCEPTION 'refused by test trigger';"


def merchant(name="Acme"):
    return create_merchant(name)[0]


def endpoint(m, url, events=("*",)):
    return endpoints.create_endpoint(m, url=url, enabled_events=list(events))


def emit_events(m, n=1, type_=EventType.PAYMENT_INTENT_SUCCEEDED):
    with transaction.atomic():
        return [emit(m, type_, {"id": f"pi_{i}", "object": "payment_intent", "amount": 100 + i}) for i in range(n)]


def deliveries_of(event):
    return list(WebhookDelivery.objects.filter(event=event).order_by("endpoint_id"))


def attempt(delivery_id):
    """One full attempt through the three steps; returns (begin, recorded, attempted)."""
    begun = delivery.begin_attempt(delivery_id)
    if begun.kind is not delivery.Begin.CLAIMED:
        return begun, None, None
    attempted = delivery.perform(begun.lease)
    return begun, delivery.record(begun.lease, attempted), attempted


# --- fan-out ---------------------------------------------------------------------------


def test_fan_out_creates_one_delivery_per_subscribed_endpoint_and_a_deduped_job_each(receiver):
    m, other = merchant(), merchant("Other")
    all_, _ = endpoint(m, receiver.url("/all"))
    typed, _ = endpoint(m, receiver.url("/typed"), ["payment_intent.succeeded"])
    endpoint(m, receiver.url("/other-type"), ["customer.deleted"])
    endpoint(other, receiver.url("/other-merchant"))
    [event] = emit_events(m)
    result = fanout.drain_once()
    assert (result.fanned_out, result.deliveries, result.failed) == (1, 2, 0)
    assert {d.endpoint_id for d in deliveries_of(event)} == {all_.id, typed.id}
    assert Event.objects.get(pk=event.pk).fan_out == "fanned_out"
    keys = sql("SELECT dedupe_key, tenant FROM jobs WHERE kind = 'webhook_deliver' ORDER BY tenant")
    # The tenant is the merchant, as in every kind: the claim is fair across merchants.
    assert sorted(keys) == sorted((delivery.dedupe_key(d.pk), m.id) for d in deliveries_of(event))
    # A replay of the event's transaction (as after a crash) creates nothing new.
    sql("UPDATE events SET fan_out = 'pending' WHERE id = %s", [event.pk])
    assert fanout.drain_once().deliveries == 2
    assert WebhookDelivery.objects.count() == 2
    assert sql("SELECT count(*) FROM jobs WHERE kind = 'webhook_deliver'")[0][0] == 2


def test_an_event_nobody_subscribed_to_is_fanned_out_with_no_delivery():
    m = merchant()
    [event] = emit_events(m)
    assert fanout.drain_once().fanned_out == 1
    assert Event.objects.get(pk=event.pk).fan_out == "fanned_out" and not WebhookDelivery.objects.exists()


def test_an_event_that_fails_every_pass_is_abandoned_after_five_with_one_alert(receiver):
    m = merchant()
    endpoint(m, receiver.url("/a"))
    poison, healthy = emit_events(m, 2)
    # A real database failure for one event's deliveries: a trigger refuses its insert.
    refuse_poison = f"IF NEW.event_id = '{poison.pk}' THEN {REFUSE_EVERY_INSERT} END IF; RETURN NEW;"
    with delivery_insert_trigger("test_refuse_delivery", refuse_poison):
        first = fanout.drain_once()
        assert (first.fanned_out, first.failed) == (1, 1)  # the healthy one is not held back
        for _ in range(4):
            fanout.drain_once()
        assert fanout.drain_once().seen == 0  # abandoned: no longer read
    assert sql("SELECT fan_out, fan_out_failures FROM events WHERE id = %s", [poison.pk]) == [("abandoned", 5)]
    assert Event.objects.get(pk=healthy.pk).fan_out == "fanned_out"
    # One alert, raised by the pass that made the transition (jobs.operator.alerts: logged and sent by the worker).
    assert list(Alert.objects.filter(source="webhooks.event_abandoned").values_list("key", flat=True)) == [
        f"webhook_event_abandoned:{poison.pk}"
    ]


def test_transient_database_errors_never_count_toward_abandoning_an_event(receiver):
    m = merchant()
    endpoint(m, receiver.url("/a"))
    [event] = emit_events(m)
    # A real statement timeout (what a migration holding a lock produces): the delivery
    # insert for this event sleeps past the session's statement_timeout.
    slow_insert = f"IF NEW.event_id = '{event.pk}' THEN PERFORM pg_sleep(2); END IF; RETURN NEW;"
    with delivery_insert_trigger("test_slow_delivery", slow_insert):
        sql("SET statement_timeout = '100ms'")
        try:
            passes = [fanout.drain_once() for _ in range(7)]
        finally:
            sql("RESET statement_timeout")
    assert sql("SELECT fan_out, fan_out_failures FROM events WHERE id = %s", [event.pk]) == [("pending", 0)]
    assert not Alert.objects.exists()
    assert [(p.failed, p.transient, p.abandoned) for p in passes] == [(1, 1, 0)] * 7
    assert fanout.drain_once().fanned_out == 1  # the database is healthy again: nothing was lost


def test_an_event_that_fails_transiently_on_every_pass_alerts_once_at_the_bound_and_stays_pending(receiver):
    m = merchant()
    endpoint(m, receiver.url("/a"))
    [event] = emit_events(m)
    slow_insert = f"IF NEW.event_id = '{event.pk}' THEN PERFORM pg_sleep(2); END IF; RETURN NEW;"
    with delivery_insert_trigger("test_slow_delivery", slow_insert):
        sql("SET statement_timeout = '100ms'")
        try:
            passes = [fanout.drain_once(transient_alert_after=3) for _ in range(6)]
        finally:
            sql("RESET statement_timeout")
    assert [p.transient for p in passes] == [1] * 6
    # Counted in the database (a restarted worker keeps counting), never toward abandoning.
    assert sql(
        "SELECT fan_out, fan_out_failures, fan_out_transient_failures FROM events WHERE id = %s", [event.pk]
    ) == [("pending", 0, 6)]
    [alert] = Alert.objects.all()  # once, at the third pass, not at every pass after it
    assert (alert.key, alert.source) == (f"webhook_event_stuck:{event.pk}", "webhooks.event_stuck")
    assert alert.details["transient_failures"] == 3 and "statement timeout" in alert.details["error"]
    assert fanout.drain_once().fanned_out == 1  # still pending, so nothing was lost once it heals


def test_an_abandoned_event_can_be_re_driven_and_alerts_again_if_abandoned_again(receiver):
    from webhooks.services.redrive import redrive_event

    m = merchant()
    endpoint(m, receiver.url("/a"))
    [event] = emit_events(m)
    with delivery_insert_trigger("test_refuse_delivery", REFUSE_EVERY_INSERT):
        for _ in range(5):
            fanout.drain_once()
        assert not redrive_event("evt_nope")
        assert redrive_event(event.pk)
        assert not redrive_event(event.pk)  # pending now: not re-drivable twice
        assert sql("SELECT fan_out, fan_out_failures FROM events WHERE id = %s", [event.pk]) == [("pending", 0)]
        for _ in range(5):
            fanout.drain_once()  # still broken: abandoned again, and alerted again
        assert redrive_event(event.pk)
    assert sorted(Alert.objects.values_list("key", flat=True)) == [
        f"webhook_event_abandoned:{event.pk}",
        f"webhook_event_abandoned:{event.pk}:1",
    ]
    assert fanout.drain_once().deliveries == 1  # fixed: the re-driven event fans out
    assert Event.objects.get(pk=event.pk).fan_out == "fanned_out"


def test_a_failure_counted_after_someone_else_fanned_the_event_out_is_neither_retry_nor_alert():
    m = merchant()
    [event] = emit_events(m)
    fanout.fan_out_event(event.pk)
    assert repository.count_fan_out_failure(event.pk) is None
    assert Event.objects.get(pk=event.pk).fan_out_failures == 0


# --- one attempt -----------------------------------------------------------------------


def test_a_delivery_is_signed_with_every_active_secret_and_succeeds(receiver):
    m = merchant()
    ep, first_secret = endpoint(m, receiver.url("/hooks/a"))
    second_secret = endpoints.rotate_secret(ep)
    receiver.add_secrets(first_secret, second_secret)
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    begun, recorded, attempted = attempt(d.pk)
    assert begun.kind is delivery.Begin.CLAIMED and not recorded.stale
    d.refresh_from_db()
    assert (d.state, d.attempts, d.last_status_code) == (DeliveryState.SUCCEEDED, 1, 200)
    assert d.payload_sha256 == attempted.payload_sha256 and d.lease_token is None
    [got] = receiver.received("/hooks/a")
    assert got["event_id"] == event.pk and got["type"] == "payment_intent.succeeded" and got["attempt"] == "1"
    assert sorted(got["verified_by"]) == sorted([fingerprint(first_secret), fingerprint(second_secret)])
    assert got["body_sha256"] == d.payload_sha256  # what was hashed is what went on the wire
    [row] = DeliveryAttempt.objects.filter(delivery=d)
    assert (row.state, row.status_code, row.number) == (AttemptState.SUCCEEDED, 200, 1)
    # A finished delivery is not attempted again.
    assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE


def test_the_body_is_the_event_api_rendering(receiver):
    m = merchant()
    _, secret = endpoint(m, receiver.url("/hooks/body"))
    [event] = emit_events(m)
    stored = Event.objects.get(pk=event.pk)
    body = delivery.render_body(stored)
    assert json.loads(body) == render_event(stored)
    assert verify(body, signature_header(body, [secret], 1_800_000_000), secret, now=1_800_000_000)


def test_failures_ride_the_ladder_to_exhausted_with_a_row_per_try_and_one_alert(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/fail?mode=status&status=500"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    states = []
    for _ in range(3):
        _, recorded, _ = attempt(d.pk)
        states.append(recorded.delivery_state)
    assert states == [DeliveryState.PENDING, DeliveryState.PENDING, DeliveryState.EXHAUSTED]
    assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE
    rows = list(
        DeliveryAttempt.objects.filter(delivery=d).order_by("number").values_list("number", "state", "status_code")
    )
    assert rows == [(1, "failed", 500), (2, "failed", 500), (3, "failed", 500)]
    [alert] = Alert.objects.all()
    assert alert.key.startswith(f"webhook_endpoint_exhausted:{d.endpoint_id}:")
    assert alert.source == "webhooks.delivery_exhausted"
    assert alert.details["first"] == {"delivery_id": d.pk, "event_id": d.event_id, "attempts": 3}
    assert alert.link == admin_change_path("webhooks_webhookendpoint", d.endpoint_id)


def test_a_receiver_that_drops_the_connection_is_no_response_with_a_null_status(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/drop?mode=drop"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    attempt(d.pk)
    row = DeliveryAttempt.objects.get(delivery=d)
    assert row.state == AttemptState.NO_RESPONSE and row.status_code is None
    # The merchant's phrase on the row (test_webhook_merchant_errors.py); the cause chain is the operators'.
    assert row.error in (
        "the endpoint closed the connection or did not answer in HTTP",
        "the connection broke while reading the answer",
    )


def test_a_slow_nameserver_spends_the_attempts_budget_not_more(receiver, settings):
    import threading

    settings.VPAY_WEBHOOK_CONNECT_TIMEOUT = 0.3
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    release = threading.Event()

    def slow_nameserver(host, port):
        release.wait(60)  # answers only after perform() has given up on it (or a minute)
        return ["127.0.0.1"]

    m = merchant()
    endpoint(m, f"http://hooks.example.test:{receiver.port}/hooks/dns")
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    begun = delivery.begin_attempt(d.pk)
    try:
        attempted = delivery.perform(begun.lease, resolver=slow_nameserver)
    finally:
        release.set()
    assert attempted.attempt_state == AttemptState.NO_RESPONSE and attempted.status_code is None
    assert attempted.error == "the host did not resolve in time"
    assert "could not resolve" in attempted.detail and "no answer within 0.3 s" in attempted.detail
    assert delivery.record(begun.lease, attempted).delivery_state == DeliveryState.PENDING  # the ladder, not refused
    assert receiver.received("/hooks/dns") == []


def test_an_answer_with_nul_bytes_is_recorded_not_retried(receiver):
    # "OK" in UTF-16 (a .NET receiver): the excerpt holds NULs, which Postgres text refuses.
    # Unsanitised, the outcome could never be recorded and the delivery would be re-sent.
    m = merchant()
    endpoint(m, receiver.url("/hooks/utf16?mode=utf16"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    _, recorded, attempted = attempt(d.pk)
    assert "\x00" in attempted.excerpt
    assert not recorded.stale and recorded.delivery_state == DeliveryState.SUCCEEDED
    row = DeliveryAttempt.objects.get(delivery=d)
    assert (row.state, row.status_code, row.response_excerpt) == ("succeeded", 200, "O\ufffdK\ufffd")
    assert len(receiver.received("/hooks/utf16")) == 1


def test_a_stale_attempt_cannot_record_success(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/s"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    late = delivery.begin_attempt(d.pk)
    late_answer = delivery.perform(late.lease)  # the receiver accepted it...
    assert late_answer.status_code == 200
    # ...but the worker stalled past its lease (the state a stalled worker leaves behind):
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d.pk])
    # Someone else recovers the lease and delivers.
    _, recorded, _ = attempt(d.pk)
    assert recorded.delivery_state == DeliveryState.SUCCEEDED
    # The late worker now tries to record its success: discarded.
    assert delivery.record(late.lease, late_answer).stale
    rows = list(DeliveryAttempt.objects.filter(delivery=d).order_by("number").values_list("number", "state"))
    assert rows == [(1, "abandoned"), (2, "succeeded")]  # recovered first: abandoned it stays
    d.refresh_from_db()
    assert (d.state, d.attempts) == (DeliveryState.SUCCEEDED, 2)
    # Both requests reached the receiver with the same event id: the duplicate receivers dedupe.
    assert [r["event_id"] for r in receiver.received("/hooks/s")] == [event.pk, event.pk]


def test_an_expired_lease_cannot_record_even_if_nobody_took_over(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/s2"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    begun = delivery.begin_attempt(d.pk)
    answer = delivery.perform(begun.lease)
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d.pk])
    assert delivery.record(begun.lease, answer).stale
    d.refresh_from_db()
    assert d.state == DeliveryState.DELIVERING  # the backstop or the next run recovers it
    assert scan.scan_once().recovered == 1
    d.refresh_from_db()
    assert d.state == DeliveryState.PENDING
    assert list(DeliveryAttempt.objects.filter(delivery=d).values_list("state", flat=True)) == ["stale"]


@pytest.mark.parametrize("recoverer", ["scan", "deliver_job"])
def test_a_lease_that_expires_on_the_last_rung_exhausts_the_delivery_with_one_alert(receiver, recoverer):
    m = merchant()
    endpoint(m, receiver.url("/hooks/dies?mode=status&status=500"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    attempt(d.pk)
    attempt(d.pk)  # two failed rungs of three
    last = delivery.begin_attempt(d.pk)
    assert last.kind is delivery.Begin.CLAIMED
    # The worker holding the last rung dies: its lease runs out with nothing recorded.
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d.pk])
    if recoverer == "scan":
        assert scan.scan_once().exhausted == 1
        assert scan.scan_once().exhausted == 0  # a second scan finds nothing to recover
    else:
        assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE
    assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE
    assert scan.scan_once().exhausted == 0
    d.refresh_from_db()
    assert (d.state, d.attempts, d.lease_token) == (DeliveryState.EXHAUSTED, 3, None)
    assert d.completed_at is not None
    states = list(DeliveryAttempt.objects.filter(delivery=d).order_by("number").values_list("state", flat=True))
    assert states == ["failed", "failed", "abandoned"]
    [alert] = Alert.objects.all()
    assert alert.key.startswith(f"webhook_endpoint_exhausted:{d.endpoint_id}:")
    assert (alert.source, alert.details["first"]["delivery_id"]) == ("webhooks.delivery_exhausted", d.pk)
    # The dead worker's late answer, should it ever arrive, is discarded and alerts nothing.
    assert delivery.record(last.lease, delivery.perform(last.lease)).stale
    assert Alert.objects.count() == 1


def test_deleting_an_endpoint_cancels_its_deliveries_with_a_reason_and_no_alert(receiver):
    m = merchant()
    ep, _ = endpoint(m, receiver.url("/hooks/gone?mode=status&status=500"))
    events = emit_events(m, 5)
    fanout.drain_once()
    d1, d2, d3, d4, d5 = (WebhookDelivery.objects.get(event=e) for e in events)
    attempt(d1.pk)  # one failed rung: pending, due again later
    in_flight = delivery.begin_attempt(d2.pk)
    answer = delivery.perform(in_flight.lease)  # sent; its answer is recorded after the delete
    assert delivery.begin_attempt(d3.pk).kind is delivery.Begin.CLAIMED  # its worker dies
    sql("DELETE FROM webhook_deliveries WHERE id = %s", [d5.pk])  # re-created below, "by a racing fan-out"
    sent = len(receiver.received("/hooks/gone"))

    assert endpoints.delete_endpoint(ep) == 2  # d1 and d4, in the delete's transaction
    assert delivery.record(in_flight.lease, answer).delivery_state == DeliveryState.CANCELLED
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d3.pk])
    assert scan.scan_once().exhausted == 0
    sql(
        "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, state, attempts, ladder_base, next_attempt_at,"
        " created_at, updated_at, cancel_reason) VALUES (%s, %s, %s, 'pending', 0, 0, now(), now(), now(), '')",
        [d5.pk, d5.event_id, ep.pk],
    )
    for d in (d1, d2, d3, d4, d5):
        assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE
    rows = sql("SELECT state, cancel_reason, completed_at IS NOT NULL FROM webhook_deliveries ORDER BY id")
    assert [(state, done) for state, _, done in rows] == [("cancelled", True)] * 5
    assert all("endpoint was deleted" in reason for _, reason, _ in rows)
    assert not Alert.objects.exists()  # the merchant chose this: nobody is paged
    assert len(receiver.received("/hooks/gone")) == sent  # nothing was sent after the delete
    assert delivery.begin_attempt(d1.pk).kind is delivery.Begin.GONE


def test_the_per_endpoint_cap_holds_back_only_that_endpoint(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 1
    m = merchant()
    slow, _ = endpoint(m, receiver.url("/slow"))
    fast, _ = endpoint(m, receiver.url("/fast"))
    events = emit_events(m, 2)
    fanout.drain_once()
    slow_1, slow_2 = (WebhookDelivery.objects.get(event=e, endpoint=slow) for e in events)
    fast_1, fast_2 = (WebhookDelivery.objects.get(event=e, endpoint=fast) for e in events)
    assert delivery.begin_attempt(slow_1.pk).kind is delivery.Begin.CLAIMED  # in flight, never finished here
    assert delivery.begin_attempt(slow_2.pk).kind is delivery.Begin.AT_CAP
    assert attempt(fast_1.pk)[1].delivery_state == DeliveryState.SUCCEEDED
    assert attempt(fast_2.pk)[1].delivery_state == DeliveryState.SUCCEEDED
    assert WebhookDelivery.objects.get(pk=slow_2.pk).attempts == 0  # waiting costs no attempt


def test_at_the_cap_a_job_waits_for_the_earliest_lease_and_a_freed_slot_wakes_the_longest_waiting(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 1
    m = merchant()
    endpoint(m, receiver.url("/capped"))
    events = emit_events(m, 3)
    fanout.drain_once()
    d1, d2, d3 = (WebhookDelivery.objects.get(event=e) for e in events)
    first = delivery.begin_attempt(d1.pk)
    assert first.kind is delivery.Begin.CLAIMED
    [(lease_left,)] = sql(
        "SELECT EXTRACT(EPOCH FROM lease_expires_at - now())::float8 FROM webhook_deliveries WHERE id = %s", [d1.pk]
    )
    waits = []
    for d in (d2, d3):
        begun = delivery.begin_attempt(d.pk)
        assert begun.kind is delivery.Begin.AT_CAP
        waits.append(begun.wait)
    # Not a fixed second: until the earliest in-flight lease could free the slot (30 s
    # here), plus up to a quarter of it as jitter.
    assert all(lease_left - 1 <= w <= lease_left * 1.25 + 1 for w in waits), (lease_left, waits)
    # Their jobs wait that long (as the deliver handler reschedules them)...
    keys = [delivery.dedupe_key(d.pk) for d in (d2, d3)]
    sql("UPDATE jobs SET run_at = now() + interval '60 seconds' WHERE dedupe_key = ANY(%s)", [keys])
    # ...until the attempt holding the slot records: it hands the slot to the longest-waiting.
    delivery.record(first.lease, delivery.perform(first.lease))
    due = dict(sql("SELECT dedupe_key, run_at <= now() FROM jobs WHERE dedupe_key = ANY(%s)", [keys]))
    assert due == {keys[0]: True, keys[1]: False}
    assert delivery.begin_attempt(d2.pk).kind is delivery.Begin.CLAIMED


def test_one_endpoint_holds_at_most_its_share_of_a_workers_threads(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8  # the global cap is not what stops it here
    assert [delivery.worker_share(c) for c in (None, 1, 2, 3, 4, 8, 32)] == [None, 1, 1, 1, 2, 4, 16]
    m = merchant()
    ep, _ = endpoint(m, receiver.url("/shared"))
    events = emit_events(m, 3)
    fanout.drain_once()
    d1, d2, d3 = (WebhookDelivery.objects.get(event=e) for e in events)
    share = delivery.worker_share(4)
    held = [delivery.begin_attempt(d.pk, share=share) for d in (d1, d2)]
    assert [b.kind for b in held] == [delivery.Begin.CLAIMED] * 2
    at_share = delivery.begin_attempt(d3.pk, share=share)
    assert at_share.kind is delivery.Begin.AT_CAP and at_share.wait >= 1.0
    assert delivery.SHARES.held(ep.pk) == 2
    delivery.record(held[0].lease, delivery.perform(held[0].lease))  # record gives the slot back
    delivery.release(held[0])  # and a second release (the handler's finally) is a no-op
    assert delivery.SHARES.held(ep.pk) == 1
    third = delivery.begin_attempt(d3.pk, share=share)
    assert third.kind is delivery.Begin.CLAIMED
    for begun in (held[1], third):
        delivery.release(begun)
    assert delivery.SHARES.held(ep.pk) == 0


def test_one_merchant_with_many_endpoints_holds_at_most_its_share_of_a_workers_threads(receiver, settings):
    # Its share is one more than an endpoint's (its own fast endpoint is never starved by its
    # slow one), however many endpoints it has.
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8
    noisy, quiet = merchant("Noisy"), merchant("Quiet")
    for i in range(4):
        endpoint(noisy, receiver.url(f"/noisy-{i}"))
    endpoint(quiet, receiver.url("/quiet"))
    noisy_events, quiet_events = emit_events(noisy, 1), emit_events(quiet, 1)
    fanout.drain_once()
    noisy_deliveries = list(WebhookDelivery.objects.filter(event=noisy_events[0]).order_by("pk"))
    assert len({d.endpoint_id for d in noisy_deliveries}) == 4
    share = delivery.worker_share(4)  # 2 per endpoint, 3 per merchant
    begun = [delivery.begin_attempt(d.pk, share=share) for d in noisy_deliveries]
    assert [b.kind for b in begun] == [delivery.Begin.CLAIMED] * 3 + [delivery.Begin.AT_CAP]
    quiet_begun = delivery.begin_attempt(WebhookDelivery.objects.get(event=quiet_events[0]).pk, share=share)
    assert quiet_begun.kind is delivery.Begin.CLAIMED
    for b in [*begun[:3], quiet_begun]:
        delivery.release(b)
    assert delivery.SHARES.held(delivery.MERCHANT_SHARE_PREFIX + noisy.pk) == 0
    last = delivery.begin_attempt(noisy_deliveries[3].pk, share=share)
    assert last.kind is delivery.Begin.CLAIMED
    delivery.release(last)


def test_an_endpoint_without_a_usable_secret_is_a_failed_attempt_never_an_unsigned_send(receiver):
    m = merchant()
    ep, _ = endpoint(m, receiver.url("/hooks/nosecret"))
    ep.secrets.all().delete()
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    _, recorded, _ = attempt(d.pk)
    assert recorded.delivery_state == DeliveryState.PENDING
    row = DeliveryAttempt.objects.get(delivery=d)
    assert row.state == AttemptState.FAILED and "no usable signing secret" in row.error and row.status_code is None
    assert receiver.received() == []
    d.refresh_from_db()
    assert d.payload_sha256 is None  # nothing was signed


def test_a_non_public_address_is_refused_for_good_and_recorded(receiver, settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = ()
    m = merchant()
    endpoint(m, f"http://localhost:{receiver.port}/hooks/ssrf")  # a name: judged when resolved
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    _, recorded, _ = attempt(d.pk)
    assert recorded.delivery_state == DeliveryState.REFUSED
    assert delivery.begin_attempt(d.pk).kind is delivery.Begin.GONE
    row = DeliveryAttempt.objects.get(delivery=d)
    assert row.state == AttemptState.FAILED and row.error == "refused: the host does not resolve to a public address"
    assert receiver.received() == []
    assert list(Alert.objects.values_list("source", flat=True)) == ["webhooks.delivery_refused"]


def test_a_body_that_no_longer_matches_the_first_signed_digest_is_not_sent(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/digest?mode=status&status=500"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    attempt(d.pk)
    assert len(receiver.received()) == 1
    sql("UPDATE webhook_deliveries SET payload_sha256 = repeat('0', 64) WHERE id = %s", [d.pk])
    attempt(d.pk)
    assert len(receiver.received()) == 1
    row = DeliveryAttempt.objects.get(delivery=d, number=2)
    assert row.state == AttemptState.FAILED and "differs from the first sent attempt" in row.error


# --- the backstop ----------------------------------------------------------------------


def test_the_backstop_re_enqueues_a_due_delivery_that_lost_its_job(receiver):
    m = merchant()
    endpoint(m, receiver.url("/hooks/lost"))
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    sql("DELETE FROM jobs WHERE kind = 'webhook_deliver'")
    assert scan.scan_once(overdue_seconds=0).requeued == 1
    assert sql("SELECT dedupe_key FROM jobs WHERE kind = 'webhook_deliver'") == [(delivery.dedupe_key(d.pk),)]
    assert scan.scan_once(overdue_seconds=0).requeued == 0  # a live job makes it a no-op


def test_the_drain_runs_again_at_once_only_after_a_pass_that_made_progress(receiver, settings):
    from webhooks.handlers import fan_out

    settings.VPAY_WEBHOOK_FAN_OUT_IDLE = 5.0
    assert fan_out(None).delay == 5.0  # nothing pending
    m = merchant()
    endpoint(m, receiver.url("/a"))
    emit_events(m, 3)
    assert fan_out(None).delay == 0.0  # progress: look again now
    assert fan_out(None).delay == 5.0  # the follow-up pass found nothing
    [poison] = emit_events(m, 1)
    with delivery_insert_trigger("test_refuse_delivery", REFUSE_EVERY_INSERT):
        assert fan_out(None).delay == 5.0  # only failures: no hot loop
    assert Event.objects.get(pk=poison.pk).fan_out_failures == 1


def test_the_deliver_step_resolves_once_and_connects_to_the_vetted_address(receiver):
    # A rebinding name: the first answer is the (allow-listed) receiver, later ones private.
    answers = iter(["127.0.0.1", "10.66.66.66", "10.66.66.66"])
    calls = []

    def rebinding(host, port):
        calls.append(host)
        return [next(answers)]

    m = merchant()
    endpoint(m, f"http://rebind.invalid:{receiver.port}/hooks/rebind")
    [event] = emit_events(m)
    fanout.drain_once()
    [d] = deliveries_of(event)
    begun = delivery.begin_attempt(d.pk)
    attempted = delivery.perform(begun.lease, resolver=rebinding)
    assert attempted.status_code == 200 and attempted.connected_to == ("127.0.0.1", receiver.port)
    assert calls == ["rebind.invalid"]
    assert delivery.record(begun.lease, attempted).delivery_state == DeliveryState.SUCCEEDED
    assert [r["event_id"] for r in receiver.received("/hooks/rebind")] == [event.pk]
