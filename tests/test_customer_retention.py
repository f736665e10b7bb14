"""``sweep_idle_customers``: the 365-day erasure, its guards, its paging and its isolation,
through the real job loop and the real database."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection, connections, transaction

from charges.models import PaymentIntent
from charges.services.intents import create_intent
from customers import retention
from customers.models import Customer
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from merchants.services import create_merchant
from tests.queue_support import failing_row, rows, scalar
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)  # the sweep commits per customer, as in production


def customer(merchant, days_idle: float, **fields) -> str:
    made = Customer.objects.create(merchant=merchant, email="someone@example.com", name="Some One", **fields)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE customers SET last_used_at = now() - make_interval(secs => %s) WHERE id = %s",
            [days_idle * 86400, made.id],
        )
    return made.id


def run_sweep() -> float:
    """One run of the singleton through the worker loop; seconds until its next run."""
    job_id = queue.enqueue(JobKind.SWEEP_IDLE_CUSTOMERS, {}, dedupe_key="singleton:sweep_idle_customers")
    assert Worker(concurrency=1).run_once() == 1
    [(seconds,)] = rows("SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE job_id = %s", [job_id])
    return seconds


@pytest.fixture
def merchant():
    return create_merchant("Retention")[0]


def test_364_days_idle_survives_and_366_is_erased_with_one_event_carrying_ids_only(merchant, caplog):
    kept = customer(merchant, 364)
    erased = customer(merchant, 366)
    next_run = run_sweep()
    assert list(Customer.objects.values_list("id", flat=True)) == [kept]
    [event] = Event.objects.all()
    assert event.type == "customer.deleted" and event.merchant_id == merchant.id
    assert event.data == {"id": erased, "object": "customer", "deleted": True}
    assert 3500 < next_run <= 3600  # not a full page: an hour out
    logged = " ".join(json.dumps(r.__dict__, default=str) for r in caplog.records)
    assert "someone@example.com" not in logged and "Some One" not in logged


def test_a_customer_who_gets_a_new_intent_between_the_page_read_and_the_delete_survives(merchant):
    """Creating an intent moves ``last_used_at`` in the intent's transaction. Here that
    transaction is still open when the erasure starts: the erasure waits on the row lock,
    re-checks the age guard against the committed row, and erases nothing."""
    target = customer(merchant, 400)
    assert [key[-1] for key in retention._read_page(None, 100)] == [target]  # the page read
    created = threading.Event()

    def new_intent():
        try:
            with transaction.atomic():
                create_intent(merchant, {"amount": 500, "currency": "usd", "rail": "sandbox_push", "customer": target})
                created.set()
                time.sleep(0.5)
        finally:
            connections.close_all()

    other = threading.Thread(target=new_intent)
    other.start()
    assert created.wait(10)
    assert retention.erase_if_idle(target) is False
    other.join(10)
    assert Customer.objects.filter(id=target).exists()
    assert PaymentIntent.objects.get().customer_id == target
    assert list(Event.objects.values_list("type", flat=True)) == ["payment_intent.created"]  # no customer.deleted


def test_a_customer_with_a_payment_in_flight_survives_however_idle(merchant):
    """The guard ``charges`` registers: a confirmed, unfinished intent keeps its customer."""
    in_flight = customer(merchant, 500)
    finished = customer(merchant, 500)
    for customer_id, status in ((in_flight, "processing"), (finished, "succeeded")):
        intent = create_intent(
            merchant, {"amount": 500, "currency": "usd", "rail": "sandbox_push", "customer": customer_id}
        )
        PaymentIntent.objects.filter(id=intent.id).update(status=status)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE customers SET last_used_at = now() - interval '500 days'")
    run_sweep()
    assert list(Customer.objects.values_list("id", flat=True)) == [in_flight]
    assert PaymentIntent.objects.get(status="succeeded").customer_id is None  # the record stays


def test_an_in_use_guard_keeps_a_customer_however_idle(merchant, monkeypatch):
    monkeypatch.setattr(retention, "_IN_USE", {})
    held = customer(merchant, 500, phone="hold")
    free = customer(merchant, 500)
    retention.register_in_use("test", "customers.phone = 'hold'")
    run_sweep()
    assert list(Customer.objects.values_list("id", flat=True)) == [held]
    assert list(Event.objects.values_list("data__id", flat=True)) == [free]


def test_one_poisoned_row_does_not_stop_the_page_and_the_rows_behind_it_are_erased(merchant, caplog):
    ids = [customer(merchant, 400 + i) for i in range(5)]  # oldest last: ids[4] is read first
    poisoned = ids[2]
    with failing_row("customers", "DELETE", poisoned, "poisoned row"):
        run_sweep()
    assert list(Customer.objects.values_list("id", flat=True)) == [poisoned]
    assert Event.objects.count() == 4
    [failure] = [r for r in caplog.records if "failed and was skipped" in r.getMessage()]
    assert failure.id == poisoned and "poisoned row" in failure.error


def test_more_than_one_page_drains_in_one_run(merchant):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO customers (id, merchant_id, email, name, phone, metadata, created_at, last_used_at)"
            " SELECT 'cus_bulk' || g, %s, '', '', '', '{}', now(), now() - interval '400 days'"
            " FROM generate_series(1, 250) g",
            [merchant.id],
        )
    run_sweep()
    assert scalar("SELECT count(*) FROM customers") == 0
    assert scalar("SELECT count(*) FROM events WHERE type = 'customer.deleted'") == 250


def test_a_pass_that_ran_out_of_budget_on_a_full_page_runs_again_at_once(merchant, monkeypatch):
    """The budget ends a pass early on a big backlog; the job then comes back at once."""
    for _ in range(3):
        customer(merchant, 400)
    original = retention.sweep_in_pages
    monkeypatch.setattr(
        retention,
        "sweep_in_pages",
        lambda ctx, **kw: original(ctx, **{**kw, "page_size": 2, "budget_seconds": 0}),
    )
    assert run_sweep() <= 0.0
    assert scalar("SELECT count(*) FROM customers") == 1  # one page of two, then out of budget
