"""Deliveries batched per endpoint (webhooks/services/carrying.py): one deliver job's run
begins, sends and records the endpoint's other due deliveries beside its own, holding their
jobs, then settles those jobs as their own runs would have. Through the shipping loop
(``Worker.run_once``) or a real ``runworker``, a real receiver process and the database."""

from __future__ import annotations

import ipaddress
import signal
import time

import pytest
from django.db import connection, transaction

from jobs import port
from jobs.adapters.inprocess import InProcessQueue
from jobs.runner.worker import Worker
from merchants.services import create_merchant
from tests.conftest import wait_for
from tests.killpoints_support import kill_env
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.services import carrying, endpoints, fanout
from webhooks.services.delivery import dedupe_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _local(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_BATCH = 8
    settings.VPAY_WEBHOOK_MAX_IN_FLIGHT = 8


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def backlog(receiver, n: int, path: str = "/a") -> tuple[object, str]:
    """``n`` events fanned out to one endpoint of a new merchant: ``n`` due deliveries."""
    merchant = create_merchant("Acme")[0]
    endpoint, _ = endpoints.create_endpoint(merchant, url=receiver.url(path), enabled_events=["*"])
    with transaction.atomic():
        for i in range(n):
            emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"})
    fanout.drain_once()
    return merchant, endpoint.pk


def states() -> dict[str, int]:
    return dict(sql("SELECT state, count(*) FROM webhook_deliveries GROUP BY state"))


def deliver_jobs() -> int:
    return sql("SELECT count(*) FROM jobs WHERE kind = 'webhook_deliver'")[0][0]


def test_one_run_sends_a_batch_each_attempt_with_its_own_row_and_lease_and_the_carried_jobs_finish(
    receiver, monkeypatch
):
    monkeypatch.setattr(carrying, "ROUNDS_SECONDS", 0.0)  # one batch (the rounds: below)
    backlog(receiver, 11)
    assert Worker().run_once()
    # The carrier and 7 carried (VPAY_WEBHOOK_BATCH 8): each sent once, each its own attempt.
    assert states() == {"succeeded": 8, "pending": 3}
    assert len(receiver.received("/a")) == 8
    attempts = sql("SELECT delivery_id, lease_token, state FROM webhook_delivery_attempts")
    assert len(attempts) == 8 and len({a[1] for a in attempts}) == 8 and {a[2] for a in attempts} == {"succeeded"}
    # Eight jobs finished in one run: the carrier's settle and the carried ones' settle_held.
    assert deliver_jobs() == 3
    assert sql(
        "SELECT count(*) FROM jobs j JOIN webhook_deliveries d ON j.dedupe_key = 'webhook_deliver:' || d.id"
        " WHERE d.state = 'pending' AND j.run_at <= now() AND j.locked_at IS NULL"
    ) == [(3,)]
    assert Worker().run_once()
    assert states() == {"succeeded": 11} and deliver_jobs() == 0


@pytest.mark.parametrize(("due", "batches"), [(1, 0), (2, 1)])
def test_a_delivery_its_begin_found_alone_looks_for_no_batch(receiver, monkeypatch, due, batches):
    """At idle the begin counts the endpoint's due deliveries: with none but its own, the
    carrier goes alone and no transaction looks for others to carry beside it."""
    looked: list[int] = []
    carry = carrying.carry
    monkeypatch.setattr(carrying, "carry", lambda lease, **kw: looked.append(lease.delivery_id) or carry(lease, **kw))
    backlog(receiver, due)
    assert Worker().run_once()
    assert len(looked) == batches
    assert states() == {"succeeded": due}


def test_after_a_full_batch_answered_with_successes_the_carrier_carries_the_next_ones(receiver):
    backlog(receiver, 30)
    assert Worker().run_once()
    # 8, then 8 a round while each is full and answered with successes (a fast receiver:
    # all of them within ROUNDS_SECONDS), the last round the 6 left.
    assert states() == {"succeeded": 30}
    assert len(receiver.received("/a")) == 30 and deliver_jobs() == 0
    attempts = sql("SELECT count(*), count(DISTINCT lease_token) FROM webhook_delivery_attempts")
    assert attempts == [(30, 30)]


def test_no_next_batch_after_an_answer_that_is_not_a_success(receiver, settings):
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (300.0, 300.0)
    receiver.set_mode("/a", "status", status=500)
    backlog(receiver, 20)
    assert Worker().run_once()
    assert sql("SELECT count(*) FROM webhook_delivery_attempts") == [(8,)]  # one batch: the carrier's and 7


def test_a_batch_stays_under_the_endpoints_cap(receiver, settings):
    backlog(receiver, 10)
    # Three attempts in flight elsewhere (live leases): the cap of 8 leaves room for 5.
    sql(
        "UPDATE webhook_deliveries SET state = 'delivering', lease_token = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 minute'"
        " WHERE id IN (SELECT id FROM webhook_deliveries ORDER BY id DESC LIMIT 3)"
    )
    assert Worker().run_once()
    assert states() == {"succeeded": 5, "pending": 2, "delivering": 3}


def test_failed_carried_attempts_wait_for_their_next_rung_on_their_own_jobs(receiver, settings):
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (300.0, 300.0)
    receiver.set_mode("/a", "status", status=500)
    backlog(receiver, 4)
    assert Worker().run_once()
    assert states() == {"pending": 4}
    # Each job, the carried ones included, waits for its delivery's next attempt (5 minutes),
    # not longer (the hold) and not less.
    rows = sql(
        "SELECT EXTRACT(EPOCH FROM j.run_at - d.next_attempt_at)::float8, j.locked_at IS NULL"
        " FROM jobs j JOIN webhook_deliveries d ON j.dedupe_key = 'webhook_deliver:' || d.id"
    )
    assert len(rows) == 4 and all(-1 < lag < 5 and unlocked for lag, unlocked in rows), rows


def test_a_batch_of_one_when_the_setting_says_so(receiver, settings):
    settings.VPAY_WEBHOOK_BATCH = 1
    backlog(receiver, 3)
    assert Worker().run_once()
    assert states() == {"succeeded": 1, "pending": 2}


def open_the_hosts_breaker(receiver, settings, n: int) -> None:
    """``n`` deliveries due to a receiver answering 500; one attempt alone, whose failure
    opens the host's breaker (one failure is its threshold), then batches of 8 again."""
    settings.VPAY_WEBHOOK_BREAKER_FAILURES = 1
    receiver.set_mode("/a", "status", status=500)
    backlog(receiver, n)
    settings.VPAY_WEBHOOK_BATCH = 1
    assert Worker().run_once()
    settings.VPAY_WEBHOOK_BATCH = 8


def test_nothing_is_carried_past_an_open_breaker(receiver, settings):
    """A job out of deferrals goes ahead through an open breaker (so the ladder still ends
    its delivery); the endpoint's other deliveries are not carried with it."""
    open_the_hosts_breaker(receiver, settings, 4)
    sql("UPDATE jobs SET run_at = now(), deferrals = 1000 WHERE kind = 'webhook_deliver'")
    sql("UPDATE webhook_deliveries SET next_attempt_at = now()")
    before = len(receiver.received("/a"))
    assert Worker().run_once()
    assert len(receiver.received("/a")) == before + 1


def test_the_in_process_queue_holds_nothing_so_each_delivery_goes_on_its_own(receiver):
    backlog(receiver, 3)
    with port.use(InProcessQueue()):
        held = port.hold_waiting([dedupe_key(i) for (i,) in sql("SELECT id FROM webhook_deliveries")], 60)
        assert held.names == []
        assert port.settle_held([(dedupe_key(1), None)], held) == 0


def test_held_jobs_are_the_waiting_due_ones_and_settle_only_while_still_waiting(receiver):
    backlog(receiver, 3)
    ids = [i for (i,) in sql("SELECT id FROM webhook_deliveries ORDER BY id")]
    names = [dedupe_key(i) for i in ids]
    # The first is running (leased): not held. The others are held for a minute.
    sql(
        "UPDATE jobs SET locked_by = 'elsewhere', locked_at = now(), heartbeat_at = now(), lease_token = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 minute' WHERE dedupe_key = %s",
        [names[0]],
    )
    # A suspect (it was running when a worker died: judged alone) and a job whose cancel was
    # asked are never held either.
    sql("UPDATE jobs SET crashes = 1 WHERE dedupe_key = %s", [names[1]])
    assert port.hold_waiting(names, 60).names == names[2:]
    sql("UPDATE jobs SET crashes = 0, run_at = now() WHERE dedupe_key = ANY(%s)", [names[1:]])
    sql(
        "UPDATE jobs SET cancel_requested_at = now(), cancel_requested_by = 'ops', cancel_reason = 'test'"
        " WHERE dedupe_key = %s",
        [names[2]],
    )
    assert port.hold_waiting(names, 60).names == [names[1]]
    sql(
        "UPDATE jobs SET run_at = now(), cancel_requested_at = NULL, cancel_requested_by = '', cancel_reason = ''"
        " WHERE dedupe_key = ANY(%s)",
        [names[1:]],
    )
    held = port.hold_waiting(names, 60)
    assert held.names == names[1:]
    assert (
        sql("SELECT count(*) FROM jobs WHERE dedupe_key = ANY(%s) AND run_at > now() + interval '59 s'", [names])[0][0]
        == 2
    )
    # Held again: no longer due, so not taken twice.
    assert port.hold_waiting(names, 60).names == []
    # One of the held ran on its own meanwhile (or was moved): its run_at is no longer the
    # hold's, and the settle leaves it alone.
    sql("UPDATE jobs SET run_at = now() + interval '30 s' WHERE dedupe_key = %s", [names[1]])
    # Settled: the running one and the moved one left to themselves, the other due in 5 s.
    assert port.settle_held([(names[0], None), (names[1], None), (names[2], 5.0)], held) == 1
    rows = dict(sql("SELECT dedupe_key, EXTRACT(EPOCH FROM run_at - now())::float8 FROM jobs"))
    assert set(rows) == set(names) and 3 < rows[names[2]] <= 5 and 25 < rows[names[1]] <= 30


@pytest.mark.rehearse  # make test kills at webhook.carried in tests/test_killpoints.py's fast cases
def test_a_worker_killed_with_a_carried_batch_in_flight_leaves_it_to_a_replacement(
    receiver, start_worker, tmp_path, settings
):
    """SIGKILL right after a batch's attempt rows committed and its jobs were held: each
    carried delivery's job runs when its hold ends, recovers the abandoned attempt, and
    delivers; nothing is lost and nothing is left without a job."""
    receiver.set_mode("/a", "slow", delay=0.3)
    backlog(receiver, 12)
    env = {
        "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        "VPAY_WEBHOOK_TIMEOUT": "2",
        "VPAY_WEBHOOK_LEASE_SECONDS": "4",
        "VPAY_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2",
        "VPAY_WEBHOOK_SCAN_PERIOD": "1",
    }
    doomed = start_worker(
        "--concurrency", "4", "--worker-id", "doomed", env={**env, **kill_env(tmp_path, "webhook.carried:1")}
    )
    assert doomed.proc.wait(timeout=60) == -signal.SIGKILL, doomed.output()[-2000:]
    in_flight = sql("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'")[0][0]
    assert in_flight >= 2  # the carrier's own and at least one carried
    held = sql(
        "SELECT count(*) FROM jobs j JOIN webhook_deliveries d ON j.dedupe_key = 'webhook_deliver:' || d.id"
        " WHERE d.state = 'delivering' AND j.locked_at IS NULL AND j.run_at > d.lease_expires_at"
    )[0][0]
    assert held >= 1
    started = time.monotonic()
    start_worker("--concurrency", "4", "--worker-id", "replacement", env={**env, **kill_env(tmp_path, None)})
    wait_for(lambda: states() == {"succeeded": 12}, timeout=90, message="every delivery")
    assert time.monotonic() - started < 60
    assert sql("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'abandoned'")[0][0] == in_flight
    assert deliver_jobs() == 0 and sql("SELECT count(*) FROM dead_letters")[0][0] == 0
    event_ids = {r["event_id"] for r in receiver.received("/a") if r["event_id"]}
    assert len(event_ids) == 12


def test_a_half_open_breakers_probe_goes_alone(receiver, settings):
    """Once the host's breaker has cooled down, the next attempt is its probe: it carries
    nothing, however many of the endpoint's deliveries are due."""
    settings.VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS = 0.5
    open_the_hosts_breaker(receiver, settings, 5)
    receiver.set_mode("/a", "ok")
    time.sleep(0.6)  # the cool-down is over: the next attempt probes
    sql("UPDATE jobs SET run_at = now() WHERE kind = 'webhook_deliver'")
    sql("UPDATE webhook_deliveries SET next_attempt_at = now()")
    assert Worker().run_once()
    assert sql("SELECT count(*) FROM webhook_delivery_attempts") == [(2,)]
    assert states() == {"succeeded": 1, "pending": 4}


def test_a_send_thread_that_opens_a_connection_has_it_closed_when_the_send_ends():
    """A send may write (the alert about a body that no longer matches its digest): the
    pool's thread does not keep that connection between sends."""
    from django.db import connection as thread_connection

    from vpay.send_pool import SendPool

    pool = SendPool("test-send")

    def query() -> int:
        with thread_connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    pid = pool.submit(1, query).result(timeout=10)
    assert pool.submit(1, lambda: thread_connection.connection).result(timeout=10) is None
    wait_for(
        lambda: sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]) == [(0,)],
        timeout=5,
        message="the send thread's connection closed",
    )
