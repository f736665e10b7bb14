"""Refunds driven to settlement by the real worker (``manage.py runworker`` subprocesses)
against the sandbox rail over HTTP, with the policies shrunk through the settings
production reads. The rail records what it received, so "one refund at the rail" is
counted there, not inferred from our own rows."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.charges_support import FAST_POLICY, events, scalar, sql
from tests.conftest import wait_for
from tests.refund_support import amount_refunded

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def payment_policy() -> dict:
    """The payment_stack's policy here: the charges' shrunk numbers, and the refunds' too."""
    return {
        **FAST_POLICY,
        "VPAY_REFUND_POLL_LADDER_SECONDS": "0.05,0.1,0.1,0.2",
        "VPAY_REFUND_HORIZON_SECONDS": 3600.0,
        "VPAY_REFUND_POLL_PAST_HORIZON_SECONDS": 0.5,
    }


def refund_state(table: str, object_id: str) -> str | None:
    return scalar(f"SELECT status FROM {table} WHERE id = %s", [object_id])


def settled(refund_id: str, status: str, timeout: float = 30.0) -> dict:
    wait_for(lambda: refund_state("refunds", refund_id) == status, timeout, message=f"refund {status}")
    (row,) = sql("SELECT status, failure_code, amount FROM refunds WHERE id = %s", [refund_id])
    return dict(zip(("status", "failure_code", "amount"), row, strict=True))


def event_types(refund_id: str) -> list[str]:
    return [t for t, _ in events(refund_id) if t.startswith("refund.")]


def test_a_refund_is_sent_once_and_settles_to_succeeded_with_one_event(payment_stack):
    payment_stack.worker()
    intent_id, charge_id = payment_stack.paid(6001)
    payment_stack.rail.scenario(amount=2001, after_polls=2)
    refund = payment_stack.acme.refund(intent_id, amount=2001).json()
    settled(refund["id"], "succeeded")
    time.sleep(0.5)  # a re-run would have written a second event by now
    assert event_types(refund["id"]) == ["refund.succeeded"]
    ((_, data),) = events(refund["id"], "refund.succeeded")
    assert (data["object"], data["status"], data["amount"], data["payment_intent"]) == (
        "refund",
        "succeeded",
        2001,
        intent_id,
    )
    assert amount_refunded(intent_id) == 2001
    (held,) = payment_stack.refunds_at_rail(charge_id)
    assert (held["reference"], held["amount"], held["submits"]) == (refund["id"], 2001, 1)
    (post,) = payment_stack.posts(refund["id"])
    assert post["idempotency_key"] == refund["id"] and post["body"]["charge_reference"] == charge_id
    # Every request is in provider_requests, answered, against the refund and its charge.
    rows = sql(
        "SELECT operation, status_code, rail_status, charge_id FROM provider_requests WHERE refund_id = %s ORDER BY id",
        [refund["id"]],
    )
    assert rows == [
        ("refund_submit", 200, "pending", charge_id),
        ("refund_status", 200, "pending", charge_id),
        ("refund_status", 200, "succeeded", charge_id),
    ]
    assert scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [f"refund:poll:{refund['id']}"]) == 0
    got = payment_stack.acme.call("GET", f"/v1/refunds/{refund['id']}").json()
    assert (got["status"], got["failure_code"]) == ("succeeded", None)


def test_a_refund_the_rail_fails_is_failed_with_its_code_and_its_amount_given_back(payment_stack):
    payment_stack.worker()
    intent_id, _ = payment_stack.paid(6002)
    payment_stack.rail.scenario(amount=2002, outcome="failed", failure_code="account_closed")
    refund = payment_stack.acme.refund(intent_id, amount=2002).json()
    assert settled(refund["id"], "failed")["failure_code"] == "account_closed"
    assert event_types(refund["id"]) == ["refund.failed"]
    assert amount_refunded(intent_id) == 0
    # The amount may be refunded again.
    again = payment_stack.acme.refund(intent_id).json()
    assert again["amount"] == 6002
    settled(again["id"], "succeeded")


def test_a_refund_the_rail_refuses_for_good_fails_as_rail_rejected(payment_stack):
    payment_stack.worker()
    intent_id, charge_id = payment_stack.paid(6003)
    payment_stack.rail.scenario(amount=2003, submit_status=422)
    refund = payment_stack.acme.refund(intent_id, amount=2003).json()
    assert settled(refund["id"], "failed")["failure_code"] == "rail_rejected"
    assert payment_stack.refunds_at_rail(charge_id) == [] and amount_refunded(intent_id) == 0


@pytest.mark.parametrize("lost", ["dropped", "late"])
def test_a_lost_answer_is_found_by_the_poll_and_the_refund_is_never_sent_twice(payment_stack, lost):
    # dropped: the rail takes the refund and closes the connection. late: it answers after
    # our timeout (1 s here). Either way the request row says "sent, no answer".
    payment_stack.rail.scenario(amount=2004, **({"drop_submits": 1} if lost == "dropped" else {"submit_delay": 1.5}))
    payment_stack.worker()
    intent_id, charge_id = payment_stack.paid(6004)
    refund = payment_stack.acme.refund(intent_id, amount=2004).json()
    settled(refund["id"], "succeeded")
    first = sql(
        "SELECT status_code, answered_at IS NOT NULL, error <> '' FROM provider_requests"
        " WHERE refund_id = %s AND operation = 'refund_submit'",
        [refund["id"]],
    )
    assert first == [(None, True, True)]  # answered with no status: the cause is the evidence
    assert len(payment_stack.posts(refund["id"])) == 1  # asked about, never resent
    (held,) = payment_stack.refunds_at_rail(charge_id)
    assert held["submits"] == 1
    assert event_types(refund["id"]) == ["refund.succeeded"]


def test_killing_the_worker_mid_refund_then_restarting_leaves_exactly_one_refund_at_the_rail(payment_stack):
    # The window must exceed the rail timeouts (the startup check charges.E001).
    payment_stack.set_policy(VPAY_RAIL_TIMEOUT_SECONDS=8.0, VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS=20.0)
    first = payment_stack.worker("--heartbeat", "0.25")
    intent_id, charge_id = payment_stack.paid(6005)
    payment_stack.rail.scenario(amount=2005, submit_delay=5.0)
    refund = payment_stack.acme.refund(intent_id, amount=2005).json()
    # The rail received the POST and holds its answer: kill the worker inside the call.
    wait_for(lambda: payment_stack.posts(refund["id"]), 15, message="the refund's POST")
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    # The request row was committed before the call, and nothing answered it.
    assert (
        scalar(
            "SELECT count(*) FROM provider_requests WHERE refund_id = %s AND operation = 'refund_submit'"
            " AND answered_at IS NULL",
            [refund["id"]],
        )
        == 1
    )
    assert refund_state("refunds", refund["id"]) == "submitting"
    payment_stack.rail.scenario(amount=2005)  # prompt from now on
    # The replacement's reaper frees the dead worker's lease; the poll finds a request that
    # went out unanswered and asks the rail about it instead of sending it again.
    payment_stack.worker("--heartbeat", "1")
    settled(refund["id"], "succeeded")
    (held,) = payment_stack.refunds_at_rail(charge_id)
    assert held["submits"] == 1 and len(payment_stack.posts(refund["id"])) == 1
    time.sleep(0.5)
    assert event_types(refund["id"]) == ["refund.succeeded"]


def test_a_rail_answering_503_forever_leaves_the_refund_unresolved_with_an_alert_then_a_late_success(payment_stack):
    payment_stack.set_policy(VPAY_REFUND_HORIZON_SECONDS=2.0, VPAY_REFUND_POLL_PAST_HORIZON_SECONDS=0.4)
    worker = payment_stack.worker()
    intent_id, _ = payment_stack.paid(6006)
    payment_stack.rail.scenario(amount=2006, error_polls=-1)
    refund = payment_stack.acme.refund(intent_id, amount=2006).json()
    settled(refund["id"], "unresolved", timeout=20)
    assert scalar(
        "SELECT unresolved_at - created_at >= interval '2 seconds' FROM refunds WHERE id = %s", [refund["id"]]
    )
    assert amount_refunded(intent_id) == 2006  # it may have moved: still counted
    key = f"refund_unresolved:{refund['id']}:%"
    wait_for(lambda: scalar("SELECT count(*) FROM alerts WHERE key LIKE %s", [key]) >= 2, 15, message="re-alerts")
    wait_for(lambda: "is unresolved after" in worker.output(), 15, message="the alert line")
    line = next(json.loads(x) for x in worker.output().splitlines() if '"ALERT: Refund' in x)
    assert line["alert"] is True and line["details"]["refund_id"] == refund["id"]
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    payment_stack.rail.scenario(amount=2006)
    settled(refund["id"], "succeeded", timeout=15)
    assert event_types(refund["id"]) == ["refund.succeeded"]
