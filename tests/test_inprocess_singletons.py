"""The in-process adapter keeps the singletons in its process: with no ``runworker`` at all,
an event committed by payment code is fanned out and delivered, and a singleton that ends
for good comes back (the outbox drain never stays stopped)."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from jobs import port, registry
from jobs.adapters.inprocess import SINGLETON_RESEED_SECONDS, InProcessQueue
from jobs.kinds import JobKind
from jobs.runner.decisions import Disposition, Settle
from merchants.services import create_merchant
from tests.conftest import wait_for
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.services import endpoints
from webhooks.ssrf import parse_cidrs

pytestmark = pytest.mark.django_db(transaction=True)

FAN_OUT = registry.Singleton().dedupe_key(JobKind.WEBHOOK_FAN_OUT.value)


def singleton_names() -> set[str]:
    return {s.singleton.dedupe_key(s.kind.value) for s in registry.all_specs() if s.singleton is not None}


def test_the_configured_in_process_adapter_keeps_every_singleton_and_a_direct_one_none(settings):
    settings.VPAY_QUEUE_ADAPTER = "inprocess"
    built = port.build("inprocess")
    bare = InProcessQueue()
    try:
        assert set(built._live) == singleton_names()
        assert FAN_OUT in singleton_names()
        assert bare._live == {}
    finally:
        built.stop()
        bare.stop()


def test_an_event_is_delivered_with_no_worker_running(settings, receiver):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")
    merchant, _ = create_merchant("Acme")
    _, secret = endpoints.create_endpoint(merchant, url=receiver.url("/hook"), enabled_events=["*"])
    receiver.add_secrets(secret)
    adapter = InProcessQueue(singletons=True)
    try:
        with port.use(adapter):
            with transaction.atomic():
                event = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
            got = wait_for(receiver.received, timeout=20, message="the delivery, with no runworker")
        assert [(r["event_id"], r["verified"]) for r in got] == [(event.pk, True)]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobs")
            assert cursor.fetchone()[0] == 0  # nothing waited for a worker that is not there
    finally:
        adapter.stop()


def test_a_singleton_that_ends_for_good_is_seeded_again_a_beat_later():
    adapter = InProcessQueue(singletons=True)
    adapter.stop()  # nothing runs: the settle is applied by hand, as the loop would
    with adapter._cv:
        job = adapter._live[FAN_OUT]
        for disposition in (Disposition.DEAD_LETTERED, Disposition.FINISHED, Disposition.CANCELLED):
            adapter._apply(job, Settle(disposition, error="gone"))
            again = adapter._live[FAN_OUT]
            assert again is not job and again.kind == JobKind.WEBHOOK_FAN_OUT.value
            assert again.due - time.monotonic() >= SINGLETON_RESEED_SECONDS - 1  # a beat out, not now
            job = again
    assert [name for name, _, _ in adapter.dead_letters] == [FAN_OUT]
