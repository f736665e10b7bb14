"""What the delivery's fast path may not change (issue 13): the secrets decrypted once per
process still follow rotation and the configured keys, and the digest an attempt is held
to is the one read under the row lock that claimed it, not the earlier unlocked read the
deliver job names the breaker from. Real PostgreSQL, a real receiver process."""

from __future__ import annotations

import ipaddress
import threading
import uuid

import psycopg
import pytest
from django.db import connection, transaction

from merchants.services import create_merchant
from sandbox.receiver import fingerprint
from tests.conftest import database_url, wait_for
from webhooks import attempt_batch_sql, attempt_sql, sealing
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import AttemptState, DeliveryAttempt, Event, WebhookDelivery
from webhooks.services import delivery, endpoints, fanout

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _local_receivers(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0, 0.0)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0


def one_delivery(receiver, path):
    m = create_merchant("Fast")[0]
    ep, secret = endpoints.create_endpoint(m, url=receiver.url(path), enabled_events=["*"])
    with transaction.atomic():
        emit(m, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent", "amount": 1})
    fanout.drain_once()
    return ep, secret, WebhookDelivery.objects.get(endpoint=ep)


def attempt(delivery_id, loaded=None):
    begun = delivery.begin_attempt(delivery_id)
    assert begun.kind is delivery.Begin.CLAIMED
    attempted = delivery.perform(begun.lease, loaded=loaded)
    delivery.record(begun.lease, attempted)
    return attempted


def test_a_rotated_out_secret_stops_signing_though_it_was_decrypted_before(receiver):
    ep, first, d = one_delivery(receiver, "/hooks/rot?mode=status&status=500")
    receiver.add_secrets(first)
    attempt(d.pk)  # signed with the first secret, now decrypted in this process
    second = endpoints.rotate_secret(ep, overlap_seconds=0)  # the first stops signing at once
    receiver.add_secrets(second)
    attempt(d.pk)
    first_got, second_got = receiver.received("/hooks/rot")
    assert first_got["verified_by"] == [fingerprint(first)]
    assert second_got["verified_by"] == [fingerprint(second)]


def test_a_key_set_that_cannot_open_the_secret_is_not_bypassed_by_an_earlier_decryption(receiver, settings):
    _, secret, d = one_delivery(receiver, "/hooks/keys?mode=status&status=500")
    receiver.add_secrets(secret)
    attempt(d.pk)
    settings.VPAY_SECRETS_KEYS = [sealing.derive_dev_key("another key altogether")]
    attempted = attempt(d.pk)
    assert attempted.attempt_state == AttemptState.FAILED and "no usable signing secret" in attempted.error
    assert len(receiver.received("/hooks/keys")) == 1  # never an unsigned (or stale-keyed) send


def test_the_digest_an_attempt_is_held_to_is_read_under_the_lock_that_claimed_it(receiver):
    _, secret, d = one_delivery(receiver, "/hooks/digest")
    receiver.add_secrets(secret)
    loaded = delivery.load(d.pk)  # the deliver job's early read, before any digest was stored
    # Meanwhile an attempt that ended before this one's claim recorded the digest of a body
    # that differs from what renders now.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE webhook_deliveries SET payload_sha256 = repeat('0', 64) WHERE id = %s", [d.pk])
    attempted = attempt(d.pk, loaded=loaded)
    assert attempted.attempt_state == AttemptState.FAILED and "differs from the first sent attempt" in attempted.error
    assert receiver.received("/hooks/digest") == []
    assert DeliveryAttempt.objects.get(delivery=d).error == attempted.error


@pytest.mark.parametrize(
    ("endpoints_counted", "prepared", "database_default"),
    [
        (1, True, ""),
        (2, True, ""),
        (1, False, ""),  # off: the lock and the count as two plain statements
        (2, False, ""),
        # Pinned by the connection's startup options (vpay/db_pooler.py): under REPEATABLE
        # READ the count would read the snapshot its transaction took before the wait.
        (1, True, "repeatable read"),
    ],
    ids=["one-endpoint", "a-batch-of-endpoints", "one-plain", "a-batch-plain", "database-default-repeatable-read"],
)
def test_the_cap_count_sees_an_attempt_committed_while_it_waited_for_the_endpoint_lock(
    receiver, settings, endpoints_counted, prepared, database_default
):
    # Another worker holds the endpoint's row lock and is starting an attempt; this count
    # waits for the lock. When it gets it, it must count that attempt: a count read on a
    # snapshot taken before the wait would let both workers take the last slot. The lock
    # and the count go in one round trip (webhooks/attempt_sql.py, attempt_batch_sql.py).
    ep, _, d = one_delivery(receiver, "/hooks/cap")
    other_ep = endpoints.create_endpoint(ep.merchant, url=receiver.url("/hooks/b"), enabled_events=["*"])[0]
    settings.VPAY_DB_PREPARED_STATEMENTS = prepared
    if database_default:
        database_isolation(database_default)
    other = psycopg.connect(database_url(), autocommit=False)
    try:
        other.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR NO KEY UPDATE", [ep.pk])
        other.execute(
            "UPDATE webhook_deliveries SET state = 'delivering', attempts = 1, lease_token = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 minute' WHERE id = %s",
            [d.pk],
        )
        counted = {}

        def count():
            try:
                with transaction.atomic():
                    if endpoints_counted == 1:
                        counted["in_flight"] = attempt_sql.in_flight_for_endpoint(ep.pk)[0]
                    else:
                        both = attempt_batch_sql.in_flight_for_endpoints([ep.pk, other_ep.pk])
                        counted["in_flight"] = both[ep.pk][0]
            finally:
                connection.close()

        counter = threading.Thread(target=count)
        counter.start()
        wait_for(lambda: blocked_on_a_lock(), timeout=10, message="the count to wait for the endpoint's lock")
        other.commit()
        counter.join(10)
        assert counted == {"in_flight": 1}
    finally:
        other.close()
        if database_default:
            database_isolation("")


def database_isolation(level: str) -> None:
    """The test database's default isolation for new sessions (empty: the server's again)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        name = cursor.fetchone()[0].replace('"', '""')
        if level:
            cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_isolation = %s', [level])
        else:
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_isolation')


def blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "django-cursor"])
def test_an_attempt_reads_and_writes_the_same_whether_its_statements_run_prepared_or_not(receiver, settings, prepared):
    # Prepared statements answer in text; Django's cursor (with them off behind a pooler, or
    # while queries are captured) answers typed. Every step reads both the same.
    settings.VPAY_DB_PREPARED_STATEMENTS = prepared
    _, secret, d = one_delivery(receiver, "/hooks/both?mode=status&status=500")
    receiver.add_secrets(secret)
    loaded = delivery.load(d.pk)
    assert (loaded.id, loaded.endpoint_deleted, len(loaded.sealed_secrets)) == (d.pk, False, 1)
    assert loaded.event.created_at == Event.objects.get(pk=d.event_id).created_at
    begun = delivery.begin_attempt(d.pk)
    lease = begun.lease
    assert begun.kind is delivery.Begin.CLAIMED
    assert (type(lease.attempt_id), type(lease.token), lease.number, lease.rung, lease.payload_sha256) == (
        int,
        uuid.UUID,
        1,
        1,
        None,
    )
    recorded = delivery.record(lease, delivery.perform(lease, loaded=loaded))
    assert (recorded.stale, recorded.delivery_state) == (False, "pending")  # a 500: the next rung
    with transaction.atomic():
        row = attempt_sql.lock_delivery(d.pk)
    assert (row.state, row.attempts, row.lease_token, row.endpoint_deleted, row.endpoint_disabled) == (
        "pending",
        1,
        None,
        False,
        False,
    )
    assert isinstance(row.due_in, float) and row.lease_left is None and len(row.payload_sha256) == 64
    with transaction.atomic():
        assert attempt_sql.in_flight_for_endpoint(d.endpoint_id) == (0, None, 1)  # it is due (counted up to 1)
        assert attempt_sql.in_flight_for_endpoint(d.endpoint_id, 3) == (0, None, 1)
    assert attempt_sql.waiting_deliveries(d.endpoint_id, 3) == [d.pk]  # the next rung is due at once here


def test_emit_returns_the_event_as_the_database_holds_it():
    m = create_merchant("Emitter")[0]
    with transaction.atomic():
        event = emit(m, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_9", "object": "payment_intent", "amount": 9})
    stored = Event.objects.get(pk=event.pk)
    assert (event.merchant_id, event.type, event.data, event.created_at, event.fan_out) == (
        stored.merchant_id,
        stored.type,
        stored.data,
        stored.created_at,
        stored.fan_out,
    )
    assert event.created_at.tzinfo is not None and event._state.adding is False
