"""Rows of every retained table, aged on the database clock, for the retention and health tests."""

from __future__ import annotations

import uuid

from django.db import connection, transaction

from charges.models import Charge, PaymentIntent, ProviderRequest, Refund
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.models import Alert
from jobs.runner.worker import Worker
from tests.factories.jobs import DeadLetterFactory
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryAttempt, WebhookDelivery
from webhooks.services import endpoints

MINUTE = 60.0
DAY = 86400.0


def sql(query: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def age(table: str, column: str, row_id, seconds: float) -> None:
    """Set ``column`` of one row to ``seconds`` before the database's now()."""
    sql(f"UPDATE {table} SET {column} = now() - make_interval(secs => %s) WHERE id = %s", [seconds, row_id])


def run_sweep() -> None:
    key = "singleton:sweep_expired"
    queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key=key) or queue.pull_forward(key)
    assert Worker(concurrency=1).run_once() == 1


def endpoint(merchant, name: str = "a"):
    return endpoints.create_endpoint(merchant, url=f"https://hooks.example.com/{name}", enabled_events=["*"])[0]


def event(merchant, *, seconds_old: float = 0.0, fan_out: str = "fanned_out") -> str:
    with transaction.atomic():
        made = emit(merchant, EventType.CUSTOMER_DELETED, {"id": f"cus_{uuid.uuid4().hex[:8]}", "object": "customer"})
    sql("UPDATE events SET fan_out = %s WHERE id = %s", [fan_out, made.id])
    age("events", "created_at", made.id, seconds_old)
    return made.id


def delivery(event_id: str, endpoint_obj, *, state: str, finished_seconds_ago: float | None = None) -> int:
    made = WebhookDelivery.objects.create(event_id=event_id, endpoint=endpoint_obj, state=state, attempts=1)
    DeliveryAttempt.objects.create(
        delivery=made,
        number=1,
        lease_token=uuid.uuid4(),
        state="succeeded" if state == "succeeded" else "failed",
        status_code=200 if state == "succeeded" else 500,
    )
    if finished_seconds_ago is not None:
        age("webhook_deliveries", "completed_at", made.pk, finished_seconds_ago)
    return made.pk


def provider_request(merchant, *, charge_status: str, seconds_old: float, refund_status: str | None = None) -> int:
    """A rail request that old, of a charge in that state; with ``refund_status``, one of
    a refund of that (succeeded) charge, in that state."""
    intent = PaymentIntent.objects.create(merchant=merchant, amount=1000, currency="usd", rail="sandbox_push")
    charge = Charge.objects.create(
        intent=intent,
        merchant=merchant,
        rail="sandbox_push",
        flow="push",
        amount=1000,
        currency="usd",
        status=charge_status,
    )
    refund = None
    if refund_status is not None:
        refund = Refund.objects.create(
            merchant=merchant,
            intent=intent,
            charge=charge,
            rail="sandbox_push",
            amount=500,
            currency="usd",
            status=refund_status,
        )
    request = ProviderRequest.objects.create(
        charge=charge,
        refund=refund,
        operation="refund_status" if refund else "status",
        rail="sandbox_push",
        method="GET",
        path=f"/refunds/{refund.id}" if refund else f"/charges/{charge.id}",
    )
    age("provider_requests", "sent_at", request.pk, seconds_old)
    return request.pk


def settled_letter(state: str, *, seconds_ago: float, **fields) -> int:
    letter = DeadLetterFactory(**fields)
    if state == "replayed":
        sql(
            "UPDATE dead_letters SET state = 'replayed', replayed_by = 'op', replayed_at = now() WHERE id = %s",
            [letter.pk],
        )
        age("dead_letters", "replayed_at", letter.pk, seconds_ago)
    elif state == "discarded":
        sql(
            "UPDATE dead_letters SET state = 'discarded', discarded_by = 'op', discarded_at = now(),"
            " discard_reason = 'not needed' WHERE id = %s",
            [letter.pk],
        )
        age("dead_letters", "discarded_at", letter.pk, seconds_ago)
    else:
        age("dead_letters", "created_at", letter.pk, seconds_ago)
    return letter.pk


def alert(*, seconds_old: float, logged: bool = True) -> int:
    made = Alert.objects.create(key=f"test:{uuid.uuid4()}", title="t", severity="error", source="tests.retention")
    if logged:
        sql("UPDATE alerts SET logged_at = now() WHERE id = %s", [made.pk])
    age("alerts", "created_at", made.pk, seconds_old)
    return made.pk


def ids(table: str) -> set:
    return {r[0] for r in sql(f"SELECT id FROM {table}")}
