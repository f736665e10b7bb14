"""Checkout sessions past 24 h expire in the hourly sweep: once, with one event that carries
no URL or client secret, never under a live charge, one failing session isolated, and a
backlog of several pages drained in one run. Real database, real job loop."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from charges.models import Charge, CheckoutSession, PaymentIntent
from charges.services import checkout_expiry
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from merchants.services import create_merchant
from tests.queue_support import failing_row, scalar
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)  # a transaction per session, as in production

SECRET = "cs_secret_do_not_leak"


@pytest.fixture
def merchant():
    return create_merchant("Checkout")[0]


def session(merchant, *, hours_old: float = 25, charge_status: str | None = None) -> str:
    intent = PaymentIntent.objects.create(merchant=merchant, amount=1000, currency="USD", rail="sandbox_push")
    made = CheckoutSession.objects.create(merchant=merchant, intent=intent, client_secret=SECRET)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE checkout_sessions SET created_at = now() - make_interval(secs => %s),"
            " expires_at = now() - make_interval(secs => %s) + interval '24 hours' WHERE id = %s",
            [hours_old * 3600, hours_old * 3600, made.id],
        )
    if charge_status is not None:
        Charge.objects.create(
            intent=intent,
            merchant=merchant,
            rail=intent.rail,
            flow="push",
            amount=intent.amount,
            currency=intent.currency,
            status=charge_status,
        )
    return made.id


def run_sweep() -> None:
    key = "singleton:sweep_expired"
    queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key=key) or queue.pull_forward(key)
    assert Worker(concurrency=1).run_once() == 1


def states() -> dict[str, tuple[str, str]]:
    return {s.id: (s.status, s.payment_status) for s in CheckoutSession.objects.all()}


def test_a_session_past_24_hours_expires_with_one_event_and_no_url_or_secret(merchant, caplog):
    old = session(merchant, hours_old=25)
    young = session(merchant, hours_old=23)
    run_sweep()
    assert states() == {old: ("expired", "unpaid"), young: ("open", "unpaid")}
    [event] = Event.objects.all()
    assert event.type == "checkout.session.expired" and event.data["id"] == old
    assert event.data["status"] == "expired" and event.data["payment_status"] == "unpaid"
    assert event.data["url"] is None and event.data["client_secret"] is None
    assert SECRET not in json.dumps(event.data)
    summary = next(r for r in caplog.records if r.getMessage() == "sweep_expired")
    assert summary.counts["checkout_sessions"] == 1
    run_sweep()  # a second pass finds nothing more to do
    assert Event.objects.count() == 1


def test_a_session_whose_intent_has_a_live_charge_is_not_expired(merchant):
    live = {status: session(merchant, charge_status=status) for status in ("submitting", "submitted", "unresolved")}
    settled = session(merchant, charge_status="failed")
    run_sweep()
    got = states()
    assert all(got[sid] == ("open", "unpaid") for sid in live.values())
    assert got[settled] == ("expired", "unpaid")
    assert list(Event.objects.values_list("data__id", flat=True)) == [settled]


def test_two_sweeps_at_once_expire_each_session_once_with_one_event(merchant):
    ids = [session(merchant) for _ in range(40)]
    barrier = threading.Barrier(2)
    results = []

    def sweep():
        try:
            barrier.wait(10)
            results.append(sum(checkout_expiry.expire_session(sid) for sid in ids))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(results) == 40
    assert scalar("SELECT count(*) FROM events WHERE type = 'checkout.session.expired'") == 40
    assert scalar("SELECT count(DISTINCT data->>'id') FROM events") == 40
    assert set(states().values()) == {("expired", "unpaid")}


def test_one_failing_session_is_logged_by_id_and_the_rest_of_the_page_expires(merchant, caplog):
    ids = [session(merchant, hours_old=30 - i) for i in range(5)]
    poisoned = ids[1]
    with failing_row("checkout_sessions", "UPDATE", poisoned, "poisoned session"):
        run_sweep()
    got = states()
    assert got.pop(poisoned) == ("open", "unpaid")
    assert set(got.values()) == {("expired", "unpaid")}
    [failure] = [r for r in caplog.records if "failed and was skipped" in r.getMessage()]
    assert failure.id == poisoned and "poisoned session" in failure.error
    summary = next(r for r in caplog.records if r.getMessage() == "sweep_expired")
    assert summary.counts["checkout_sessions"] == 4 and summary.counts["checkout_sessions_failed"] == 1


def test_more_than_one_page_of_sessions_expires_in_one_run(merchant):
    for _ in range(230):
        session(merchant)
    run_sweep()
    assert scalar("SELECT count(*) FROM checkout_sessions WHERE status = 'open'") == 0
    assert scalar("SELECT count(*) FROM events WHERE type = 'checkout.session.expired'") == 230
