"""The deliver job's steps in batches: several deliveries begun in one transaction and
recorded in one statement, each keeping its own attempt row, lease token and fence; the
endpoint's cap and the worker's shares counted across the batch; and the group commits
that make the batches out of concurrent executors. In-process, against the real database
and a real receiver process."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import OperationalError, connection

from tests.conftest import database_url
from tests.test_webhook_delivery import LOOPBACK, emit_events, endpoint, merchant, sql
from webhooks.models import AttemptState, DeliveryAttempt, DeliveryState, WebhookDelivery
from webhooks.services import delivery, fanout

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (60.0, 60.0)  # a failed attempt waits a minute
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_LEASE_SECONDS = 30.0


def deliveries(receiver, path, n, m=None):
    m = m or merchant()
    endpoint(m, receiver.url(path))
    events = emit_events(m, n)
    fanout.drain_once()
    return [WebhookDelivery.objects.get(event=e) for e in events]


def test_a_batch_begins_each_delivery_with_its_own_attempt_row_and_lease(receiver):
    ds = deliveries(receiver, "/batch", 4)
    begun = delivery.begin_attempts([(d.pk, None) for d in ds])
    assert [b.kind for b in begun] == [delivery.Begin.CLAIMED] * 4
    assert [b.lease.delivery_id for b in begun] == [d.pk for d in ds]  # answers in request order
    assert len({b.lease.token for b in begun}) == 4 and len({b.lease.attempt_id for b in begun}) == 4
    rows = sql(
        "SELECT d.id, d.state, d.lease_token, a.id, a.lease_token, a.state FROM webhook_deliveries d"
        " JOIN webhook_delivery_attempts a ON a.delivery_id = d.id ORDER BY d.id"
    )
    leases = {b.lease.delivery_id: b.lease for b in begun}
    for did, state, token, attempt_id, attempt_token, attempt_state in rows:
        assert (state, token, attempt_token, attempt_id, attempt_state) == (
            "delivering",
            leases[did].token,
            leases[did].token,
            leases[did].attempt_id,
            "in_flight",
        )


def test_the_cap_is_counted_across_the_batch_and_against_what_is_already_in_flight(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 3
    ds = deliveries(receiver, "/capped", 5)
    assert delivery.begin_attempt(ds[0].pk).kind is delivery.Begin.CLAIMED  # one in flight already
    begun = delivery.begin_attempts([(d.pk, None) for d in ds[1:]])
    assert [b.kind for b in begun] == [delivery.Begin.CLAIMED] * 2 + [delivery.Begin.AT_CAP] * 2
    assert all(b.wait >= 1.0 for b in begun[2:])
    assert sql("SELECT count(*) FROM webhook_deliveries WHERE state = 'delivering'") == [(3,)]
    assert WebhookDelivery.objects.get(pk=ds[4].pk).attempts == 0  # waiting costs no attempt


def test_the_workers_share_of_one_endpoint_is_counted_across_the_batch(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8
    ds = deliveries(receiver, "/shared", 3)
    ep = ds[0].endpoint_id
    begun = delivery.begin_attempts([(d.pk, 2) for d in ds])
    assert [b.kind for b in begun] == [delivery.Begin.CLAIMED] * 2 + [delivery.Begin.AT_CAP]
    assert delivery.SHARES.held(ep) == 2
    for b in begun:
        delivery.release(b)
    assert delivery.SHARES.held(ep) == 0


def test_a_begin_says_whether_the_endpoint_has_due_deliveries_beside_the_ones_it_claimed(receiver, settings):
    """What a carrier decides on: none beside a lone delivery; beside one claimed, a sibling the
    worker's share turned away in the same begin (a batch takes no share, so it can carry it)."""
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8
    [lone] = deliveries(receiver, "/lone", 1)
    (alone,) = delivery.begin_attempts([(lone.pk, None)])
    assert (alone.kind, alone.others_due) == (delivery.Begin.CLAIMED, False)

    ds = deliveries(receiver, "/shared", 2)
    claimed, turned_away = delivery.begin_attempts([(d.pk, 1) for d in ds])
    assert (claimed.kind, turned_away.kind) == (delivery.Begin.CLAIMED, delivery.Begin.AT_CAP)
    assert claimed.others_due
    for b in (claimed, turned_away):
        delivery.release(b)


def test_a_delivery_asked_for_twice_in_one_batch_is_begun_once(receiver):
    [d] = deliveries(receiver, "/twice", 1)
    first, second = delivery.begin_attempts([(d.pk, None), (d.pk, None)])
    assert (first.kind, second.kind) == (delivery.Begin.CLAIMED, delivery.Begin.BUSY)
    assert DeliveryAttempt.objects.filter(delivery=d).count() == 1


def test_a_batch_answers_each_delivery_by_its_own_state(receiver):
    due, later, done = deliveries(receiver, "/mixed", 3)
    sql("UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = %s", [later.pk])
    sql("UPDATE webhook_deliveries SET state = 'succeeded', completed_at = now() WHERE id = %s", [done.pk])
    begun = delivery.begin_attempts([(done.pk, None), (later.pk, None), (10**12, None), (due.pk, None)])
    assert [b.kind for b in begun] == [
        delivery.Begin.GONE,
        delivery.Begin.NOT_DUE,
        delivery.Begin.GONE,
        delivery.Begin.CLAIMED,
    ]
    assert 3500 < begun[1].wait <= 3600


def test_a_failed_begin_gives_back_the_share_slots_its_claims_took(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8
    ds = deliveries(receiver, "/refused", 2)
    sql(
        "CREATE OR REPLACE FUNCTION refuse_attempts() RETURNS trigger AS $$ BEGIN"
        " RAISE EXCEPTION 'refused by test trigger'; END $$ LANGUAGE plpgsql"
    )
    sql("CREATE TRIGGER refuse_attempts BEFORE INSERT ON webhook_delivery_attempts EXECUTE FUNCTION refuse_attempts()")
    try:
        with pytest.raises(Exception, match="refused by test trigger"):
            delivery.begin_attempts([(d.pk, 4) for d in ds])
    finally:
        sql("DROP TRIGGER refuse_attempts ON webhook_delivery_attempts")
    assert delivery.SHARES.held(ds[0].endpoint_id) == 0
    assert sql("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'") == [(2,)]


def test_a_batch_records_each_outcome_on_its_own_fence(receiver):
    ok, failing, late = deliveries(receiver, "/record", 3)
    begun = delivery.begin_attempts([(d.pk, None) for d in (ok, failing, late)])
    leases = [b.lease for b in begun]
    # The third attempt's lease expired before its answer is recorded: its answer is stale.
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [late.pk])
    answers = [
        delivery.Attempted(AttemptState.SUCCEEDED, status_code=200, payload_sha256="a" * 64, duration_ms=3),
        delivery.Attempted(AttemptState.FAILED, status_code=500, excerpt="nope", duration_ms=4),
        delivery.Attempted(AttemptState.SUCCEEDED, status_code=200, duration_ms=5),
    ]
    recorded = delivery.record_many(list(zip(leases, answers, strict=True)))
    assert [(r.stale, r.delivery_state) for r in recorded] == [
        (False, DeliveryState.SUCCEEDED),
        (False, DeliveryState.PENDING),
        (True, None),
    ]
    states = dict(sql("SELECT id, state FROM webhook_deliveries"))
    assert states == {ok.pk: "succeeded", failing.pk: "pending", late.pk: "delivering"}
    attempts = {a.delivery_id: a for a in DeliveryAttempt.objects.all()}
    assert (attempts[ok.pk].state, attempts[ok.pk].status_code) == ("succeeded", 200)
    assert (attempts[failing.pk].state, attempts[failing.pk].response_excerpt) == ("failed", "nope")
    assert attempts[late.pk].state == "stale" and "answer discarded (heard 200)" in attempts[late.pk].error
    [(digest, due_in)] = sql(
        "SELECT payload_sha256, EXTRACT(EPOCH FROM next_attempt_at - now()) FROM webhook_deliveries WHERE id = %s",
        [failing.pk],
    )
    assert digest is None and 50 < due_in <= 60  # the ladder's next rung
    assert sql("SELECT payload_sha256 FROM webhook_deliveries WHERE id = %s", [ok.pk]) == [("a" * 64,)]


def test_freed_slots_of_a_batch_wake_as_many_waiting_deliveries(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 2
    ds = deliveries(receiver, "/handoff", 5)
    begun = delivery.begin_attempts([(d.pk, None) for d in ds[:2]])
    waiting = [delivery.dedupe_key(d.pk) for d in ds[2:]]
    sql("UPDATE jobs SET run_at = now() + interval '60 seconds' WHERE dedupe_key = ANY(%s)", [waiting])
    ok = delivery.Attempted(AttemptState.SUCCEEDED, status_code=200, duration_ms=1)
    delivery.record_many([(b.lease, ok) for b in begun])
    due = dict(sql("SELECT dedupe_key, run_at <= now() FROM jobs WHERE dedupe_key = ANY(%s)", [waiting]))
    assert due == {waiting[0]: True, waiting[1]: True, waiting[2]: False}  # two slots: the two longest-waiting


def test_concurrent_deliver_steps_share_batches_and_every_delivery_is_sent_once(receiver, settings):
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 64
    ds = deliveries(receiver, "/concurrent", 24)
    before = (delivery.BEGINS.batches, delivery.BEGINS.requests)
    start = threading.Barrier(len(ds))
    failures: list[BaseException] = []

    def deliver(d):
        try:
            start.wait(5)
            loaded = delivery.LOADS.submit(d.pk)
            begun = delivery.BEGINS.submit((d.pk, None))
            assert begun.kind is delivery.Begin.CLAIMED
            delivery.RECORDS.submit((begun.lease, delivery.perform(begun.lease, loaded=loaded)))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(d,)) for d in ds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    assert sql("SELECT count(*) FROM webhook_deliveries WHERE state = 'succeeded'") == [(24,)]
    assert len(receiver.received("/concurrent")) == 24
    batches, requests = delivery.BEGINS.batches - before[0], delivery.BEGINS.requests - before[1]
    assert requests == 24 and batches < 24  # some begins shared a transaction


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "django-cursor"])
def test_a_batch_reads_and_writes_the_same_whether_its_statements_run_prepared_or_not(receiver, settings, prepared):
    # Pipelined statements answer through psycopg's loaders, Django's cursor (prepared
    # statements off behind a pooler, or queries captured) through its own: both the same.
    settings.VPAY_DB_PREPARED_STATEMENTS = prepared
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0)
    m = merchant()
    ok_endpoint, ok_secret = endpoint(m, receiver.url("/both-ok"))
    failing_endpoint, failing_secret = endpoint(m, receiver.url("/both-failing?mode=status&status=500"))
    receiver.add_secrets(ok_secret, failing_secret)
    [event] = emit_events(m, 1)
    fanout.drain_once()
    ok, failing = (WebhookDelivery.objects.get(event=event, endpoint=e) for e in (ok_endpoint, failing_endpoint))
    loaded = delivery.load_many([ok.pk, failing.pk, 10**12])
    assert [(x.id, x.endpoint_deleted, len(x.sealed_secrets)) for x in loaded[:2]] == [
        (ok.pk, False, 1),
        (failing.pk, False, 1),
    ] and loaded[2] is None
    assert loaded[0].event.created_at == event.created_at and loaded[0].event.data == event.data
    begun = delivery.begin_attempts([(ok.pk, None), (failing.pk, None)])
    leases = [b.lease for b in begun]
    assert [(type(x.attempt_id), type(x.token), x.number, x.rung, x.payload_sha256) for x in leases] == [
        (int, type(leases[0].token), 1, 1, None)
    ] * 2
    recorded = delivery.record_many([(x, delivery.perform(x, loaded=y)) for x, y in zip(leases, loaded, strict=False)])
    assert [(r.stale, r.delivery_state) for r in recorded] == [(False, "succeeded"), (False, "pending")]
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, state, attempts, length(payload_sha256) FROM webhook_deliveries ORDER BY id")
        assert cursor.fetchall() == sorted([(ok.pk, "succeeded", 1, 64), (failing.pk, "pending", 1, 64)])


def test_two_leases_of_one_delivery_in_one_record_batch_are_answered_each_on_its_own(receiver):
    # The first attempt's lease expired and was recovered, and a second attempt began: the
    # late answer of the first is stale even beside the second's in the same batch.
    [d] = deliveries(receiver, "/two-leases", 1)
    first = delivery.begin_attempt(d.pk).lease
    sql("UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [d.pk])
    second = delivery.begin_attempt(d.pk).lease
    assert (first.delivery_id, first.attempt_id != second.attempt_id) == (second.delivery_id, True)
    late = delivery.Attempted(AttemptState.SUCCEEDED, status_code=200, duration_ms=1)
    failed = delivery.Attempted(AttemptState.FAILED, status_code=500, duration_ms=1)
    recorded = delivery.record_many([(first, late), (second, failed)])
    assert [(r.stale, r.delivery_state) for r in recorded] == [(True, None), (False, DeliveryState.PENDING)]
    states = dict(sql("SELECT id, state FROM webhook_delivery_attempts"))
    assert states == {first.attempt_id: "abandoned", second.attempt_id: "failed"}


def test_a_batch_waits_at_most_its_lock_timeout_for_a_row_another_transaction_holds(receiver):
    # A batch stalled on one contended row would stall every executor in it: it fails
    # instead (each request then runs alone, waiting only for itself), and leaves nothing.
    first, second = deliveries(receiver, "/contended", 2)
    other = psycopg.connect(database_url(), autocommit=False)
    try:
        other.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR NO KEY UPDATE", [first.endpoint_id])
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"):
            delivery.begin_attempts([(first.pk, 2), (second.pk, 2)])
        assert time.monotonic() - started < 10
    finally:
        other.close()
    assert delivery.SHARES.held(first.endpoint_id) == 0
    assert sql("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'") == [(2,)]
