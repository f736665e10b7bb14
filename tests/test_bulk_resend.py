"""Bulk resend of webhook deliveries that failed in a window: ``manage.py webhooks resend``
submits one operation; each delivery in the window is resent once (fresh ladder, its deliver
job), the ones outside it are left alone, and the counts say so."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from jobs.bulk_models import BulkOperation
from jobs.runner.worker import Worker
from merchants.services import create_merchant
from tests.queue_support import count, execute, scalar
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services import endpoints, fanout

pytestmark = pytest.mark.django_db(transaction=True)


def failed_deliveries(hours_ago: list[float]) -> list[int]:
    """One exhausted delivery per entry, failed that many hours ago (the database clock)."""
    merchant, _ = create_merchant("Acme")
    endpoints.create_endpoint(merchant, url="https://hooks.example.com/in", enabled_events=["*"])
    for i in range(len(hours_ago)):
        with transaction.atomic():
            emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent"})
    fanout.drain_once()
    ids = list(WebhookDelivery.objects.order_by("id").values_list("id", flat=True))
    for delivery_id, hours in zip(ids, hours_ago, strict=True):
        execute(
            "UPDATE webhook_deliveries SET state = 'exhausted', attempts = 2,"
            " completed_at = now() - make_interval(secs => %s) WHERE id = %s",
            [hours * 3600, delivery_id],
        )
    execute("DELETE FROM jobs WHERE kind = 'webhook_deliver'")  # their jobs ended with them
    return ids


def run_bulk_units(settings) -> None:
    worker = Worker(concurrency=1, queues=["bulk"])
    while worker.run_once():
        pass


def test_resend_resends_each_delivery_that_failed_in_the_window_once(settings):
    settings.VPAY_BULK_QUEUE = "bulk"  # this test's worker runs the bulk units, not the deliveries
    settings.VPAY_BULK_PAGE_SIZE = 2
    inside_a, inside_b, too_old, too_recent, inside_c = failed_deliveries([2, 3, 30, 0.1, 5])
    out = io.StringIO()
    call_command("webhooks", "resend", "--since", "12h", "--until", "1h", stdout=out)
    op_id = scalar("SELECT max(id) FROM bulk_operations")
    assert out.getvalue().strip() == f"submitted bulk operation #{op_id} (resend_deliveries)"
    run_bulk_units(settings)
    op = BulkOperation.objects.get(pk=op_id)
    assert (op.state, op.matched, op.created, op.done, op.refused) == ("done", 3, 3, 3, 0)
    states = dict(WebhookDelivery.objects.values_list("id", "state"))
    assert [states[i] for i in (inside_a, inside_b, inside_c)] == [DeliveryState.PENDING] * 3
    assert [states[i] for i in (too_old, too_recent)] == [DeliveryState.EXHAUSTED] * 2
    assert count("jobs", "kind = 'webhook_deliver'") == 3
    assert WebhookDelivery.objects.get(pk=inside_a).ladder_base == 2


def test_a_resend_item_whose_delivery_was_resent_meanwhile_is_refused_not_sent_twice(settings):
    settings.VPAY_BULK_QUEUE = "bulk"
    (delivery_id,) = failed_deliveries([2])
    call_command("webhooks", "resend", "--since", "1d", stdout=io.StringIO())
    assert Worker(concurrency=1, queues=["bulk"]).run_once() == 1  # the expansion: its unit exists
    assert BulkOperation.objects.get().state == "running"
    execute("UPDATE webhook_deliveries SET state = 'pending', completed_at = NULL WHERE id = %s", [delivery_id])
    run_bulk_units(settings)
    op = BulkOperation.objects.get()
    assert (op.state, op.done, op.refused) == ("done", 0, 1)
    assert count("jobs", "kind = 'webhook_deliver'") == 0


def test_resend_needs_a_window_start_and_refuses_a_naive_time():
    with pytest.raises(CommandError, match="--since"):
        call_command("webhooks", "resend", stdout=io.StringIO())
    with pytest.raises(CommandError, match="needs a timezone"):
        call_command("webhooks", "resend", "--since", "2026-01-01T00:00:00", stdout=io.StringIO())
    assert count("bulk_operations") == 0
