"""A hung rail must not starve the rest of the queue: a real ``runworker`` process, a
sandbox rail that never answers a poll, 200 polls due at once, and a webhook emitted
meanwhile that a real receiver still gets within seconds."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from django.db import transaction

from merchants.services import create_merchant
from tests.charges_support import sql, use_rails, worker_env
from tests.conftest import wait_for
from tests.rail_support import API_KEY
from tests.test_charges_poll import live_charge
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.services import endpoints
from webhooks.ssrf import parse_cidrs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HUNG = 7001  # the amount whose scenario never answers a poll
POLLS = 200
RAIL_TIMEOUT = 30.0  # the rail's hard deadline: far longer than the test gives the webhook


def submit_to_rail(sandbox_rail, charge_id: str) -> None:
    body = json.dumps({"reference": charge_id, "amount": HUNG, "currency": "usd"}).encode()
    request = urllib.request.Request(
        f"{sandbox_rail.url}/push/charges",
        data=body,
        headers={
            "Authorization": f"Bearer {API_KEY}",
            "Idempotency-Key": charge_id,
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def test_a_rail_that_never_answers_200_due_polls_and_one_webhook_is_still_delivered_in_seconds(
    settings, tmp_path, sandbox_rail, receiver, start_worker
):
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")
    sandbox_rail.scenario(amount=HUNG, poll_delay=3600)  # holds every poll's connection open, answering nothing
    merchant, _ = create_merchant("Hung Rail Ltd")
    for _ in range(POLLS):
        charge = live_charge(merchant, status="submitted", amount=HUNG)  # its poll job due now
        submit_to_rail(sandbox_rail, charge.id)
    endpoints.create_endpoint(merchant, url=receiver.url("/hooks"), enabled_events=["*"])

    env = {
        **worker_env(rails_file, {}),
        "VPAY_RAIL_TIMEOUT_SECONDS": str(RAIL_TIMEOUT),
        "VPAY_RAIL_CONNECT_TIMEOUT_SECONDS": "1",
        "VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS": "120",
        "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        "VPAY_WEBHOOK_FAN_OUT_IDLE": "0.5",
    }
    start_worker("--concurrency", "4", env=env)

    def hung_requests() -> int:
        return sql("SELECT count(*) FROM provider_requests WHERE answered_at IS NULL")[0][0]

    # Two batches of 100 polls claimed, the first poll of each hung on the rail; the
    # worker hands back the rest of each batch after its hold limit, and every free loop
    # thread claims them. A few seconds on, the rail holds all the threads it ever will.
    wait_for(lambda: hung_requests() >= 1, timeout=20, message="a poll to hang on the rail")
    time.sleep(3.0)

    with transaction.atomic():
        event = emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_hung", "object": "payment_intent"})
    emitted = time.monotonic()
    wait_for(
        lambda: any(r["event_id"] == event.pk for r in receiver.received("/hooks")),
        timeout=10,
        message="the webhook to be delivered while the rail hangs",
    )
    delivered_after = time.monotonic() - emitted
    assert delivered_after < 10

    # The rail held at most its share of the worker (half its threads); the other polls
    # were deferred without spending an attempt, and none of them was sent.
    assert hung_requests() <= 2
    attempts, deferred = sql(
        "SELECT coalesce(max(attempts), 0), count(*) FILTER (WHERE deferrals > 0) FROM jobs WHERE kind = 'poll_charge'"
    )[0]
    assert deferred >= POLLS - 2 and attempts <= 1
