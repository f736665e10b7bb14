"""Charges driven to settlement by the real worker (``manage.py runworker`` subprocesses)
against the sandbox rail over HTTP and the real database, with the RecoveryPolicy shrunk
through the same settings production reads.

Crash points are reproduced two ways: by the real thing (a rail that drops or loses the
submit's answer, a worker SIGKILLed mid-poll) and, for the one state no live process can be
stopped in on demand (a charge committed with its job but no request row yet), by writing
the rows that crash leaves.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time

import pytest
from django.db import connection

from tests.charges_support import charge_of, events, intent_status, poll_job, scalar, sql
from tests.conftest import wait_for
from tests.factories.payments import ChargeFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def settled(intent_id: str, status: str, timeout: float = 30.0) -> dict:
    wait_for(lambda: (charge_of(intent_id) or {}).get("status") == status, timeout, message=f"charge {status}")
    return charge_of(intent_id)


def event_types(intent_id: str) -> list[str]:
    return [t for t, _ in events(intent_id)]


# --- settling ----------------------------------------------------------------------------


@pytest.mark.parametrize("rail", ["sandbox_push", "sandbox_redirect"])
def test_a_charge_settles_to_succeeded_with_one_event(payment_stack, rail):
    payment_stack.rail.scenario(amount=4001, after_polls=2)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4001, rail=rail)["id"])
    charge = settled(intent["id"], "succeeded")
    assert intent_status(intent["id"]) == "succeeded"
    time.sleep(0.5)  # a re-run would have written a second event by now
    assert event_types(intent["id"]) == ["payment_intent.succeeded"]
    ((_, data),) = events(intent["id"], "payment_intent.succeeded")
    assert data["status"] == "succeeded" and data["charge"]["status"] == "succeeded"
    assert data["redirect_url"] is None and data["charge"]["redirect_url"] is None  # no payer URL in a webhook
    polls = payment_stack.polls(charge["id"])
    assert [p["rail_status"] for p in polls] == ["pending", "succeeded"]
    assert poll_job(charge["id"]) is None  # done: the job left the table


@pytest.mark.parametrize("rail", ["sandbox_push", "sandbox_redirect"])
def test_a_charge_settles_to_failed_with_its_failure_code(payment_stack, rail):
    payment_stack.rail.scenario(amount=4002, outcome="failed", failure_code="insufficient_funds")
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4002, rail=rail)["id"])
    charge = settled(intent["id"], "failed")
    assert charge["failure_code"] == "insufficient_funds"
    assert intent_status(intent["id"]) == "failed"
    assert event_types(intent["id"]) == ["payment_intent.payment_failed"]
    response = payment_stack.acme.call("GET", f"/v1/payment_intents/{intent['id']}").json()
    assert response["last_payment_error"] == {"code": "insufficient_funds"}


def test_a_checkout_sessions_intent_succeeding_completes_the_session(payment_stack):
    payment_stack.worker()
    session = payment_stack.acme.call(
        "POST", "/v1/checkout/sessions", {"amount": 4003, "currency": "usd", "rail": "sandbox_push"}
    ).json()
    payment_stack.acme.confirm(session["payment_intent"])
    settled(session["payment_intent"], "succeeded")
    wait_for(lambda: scalar("SELECT status FROM checkout_sessions WHERE id = %s", [session["id"]]) == "complete")
    got = payment_stack.acme.call("GET", f"/v1/checkout/sessions/{session['id']}").json()
    assert (got["status"], got["payment_status"]) == ("complete", "paid")
    completed = events(session["id"], "checkout.session.completed")
    assert len(completed) == 1
    assert completed[0][1]["client_secret"] is None and completed[0][1]["url"] is None


def test_the_merchants_endpoint_receives_the_settlement_webhook_signed(payment_stack, receiver, settings):
    from webhooks.services import endpoints
    from webhooks.ssrf import parse_cidrs

    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")
    _, secret = endpoints.create_endpoint(
        payment_stack.acme.merchant, url=receiver.url("/hooks"), enabled_events=["payment_intent.succeeded"]
    )
    receiver.add_secrets(secret)
    payment_stack.policy.update({"VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32", "VPAY_WEBHOOK_FAN_OUT_IDLE": "0.5"})
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4020)["id"])
    settled(intent["id"], "succeeded")
    (event_id,) = [
        r[0]
        for r in sql(
            "SELECT id FROM events WHERE data->>'id' = %s AND type = 'payment_intent.succeeded'", [intent["id"]]
        )
    ]
    got = wait_for(lambda: [r for r in receiver.received("/hooks") if r["event_id"] == event_id], 20, message="webhook")
    assert got[0]["type"] == "payment_intent.succeeded" and got[0]["verified"] is True


# --- the confirm/worker race -----------------------------------------------------------


def test_a_confirms_compare_and_swap_wins_against_a_worker_that_claimed_its_poll_job(payment_stack):
    # Grace shorter than the rail's answer: the worker claims the poll job while the
    # confirm is inside its rail call. The window (10 s) is far longer than the call (3 s).
    payment_stack.set_policy(
        VPAY_CHARGE_CONFIRM_GRACE_SECONDS=0.2,
        VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS=10.0,
        VPAY_RAIL_TIMEOUT_SECONDS=5.0,
        VPAY_RAIL_CONNECT_TIMEOUT_SECONDS=1.0,
    )
    payment_stack.rail.scenario(amount=4004, submit_delay=3.0)
    payment_stack.worker().wait_started()  # the window below must not be spent importing Django
    intent_id = payment_stack.acme.intent(amount=4004, rail="sandbox_redirect")["id"]
    answer: dict = {}

    def confirm_meanwhile() -> None:
        try:
            answer.update(payment_stack.acme.confirm(intent_id))
        finally:
            # The request ran on this thread's own connection: closed here, or it outlives
            # the test and the test database cannot be dropped at the end of the run.
            connection.close()

    confirm = threading.Thread(target=confirm_meanwhile)
    confirm.start()
    try:
        # While the confirm waits on the rail, the worker claims the job, sees a young
        # submitting charge, asks the rail nothing and parks the job for the rest of the window.
        charge_id = wait_for(lambda: (charge_of(intent_id) or {}).get("id"), 5)
        wait_for(
            lambda: "waiting" in ((poll_job(charge_id) or {}).get("last_error") or ""), 5, message="the worker's Wait"
        )
        assert poll_job(charge_id)["due_in"] > 3
        assert charge_of(intent_id)["status"] == "submitting"  # the worker moved nothing
        assert not payment_stack.polls(charge_id)
    finally:
        confirm.join(timeout=20)
    # The confirm's compare-and-swap won: the merchant got the URL, not an error.
    assert answer["status"] == "requires_action" and answer["redirect_url"]
    # Its pull-forward made the parked poll due at once: the charge settles well inside the
    # window it would otherwise have waited out.
    charge = settled(intent_id, "succeeded", timeout=9)
    # Without the pull-forward it would settle at about 10.05 s (the window); the confirm
    # returns at about 3 s. 7 s leaves room for a loaded machine and still fails without it.
    assert charge["settled_after"] < 7.0
    assert event_types(intent_id) == ["payment_intent.succeeded"]


# --- crash points ------------------------------------------------------------------------


def crashed_before_the_post(merchant, rail: str, amount: int) -> str:
    """The rows a crash right after the confirm's first commit leaves (its intent's id)."""
    return ChargeFactory(
        intent__merchant=merchant, intent__rail=rail, intent__amount=amount, crashed_before_the_post=True
    ).intent_id


def test_crash_before_the_post__push_is_resubmitted_under_the_same_reference(payment_stack):
    payment_stack.worker()
    intent_id = crashed_before_the_post(payment_stack.acme.merchant, "sandbox_push", 4005)
    charge = settled(intent_id, "succeeded")
    posts = payment_stack.posts(charge["id"])
    assert len(posts) == 1 and posts[0]["idempotency_key"] == charge["id"]
    # Not before the window: the charge was at least that old when it was resubmitted.
    assert scalar(
        "SELECT min(r.sent_at) - min(c.created_at) >= interval '1.5 seconds' FROM provider_requests r"
        " JOIN charges c ON c.id = r.charge_id WHERE r.charge_id = %s",
        [charge["id"]],
    )
    assert event_types(intent_id) == ["payment_intent.succeeded"]


def test_crash_before_the_post__redirect_fails_as_a_dead_order_only_once_older_than_the_window(payment_stack):
    payment_stack.set_policy(VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS=3.0)
    payment_stack.worker()
    intent_id = crashed_before_the_post(payment_stack.acme.merchant, "sandbox_redirect", 4006)
    time.sleep(1.5)
    assert charge_of(intent_id)["status"] == "submitting"  # young: left alone
    charge = settled(intent_id, "failed")
    assert charge["failure_code"] == "redirect_never_delivered"
    assert charge["settled_after"] >= 3.0
    assert not payment_stack.rail.requests(charge["id"])  # nobody asked the rail anything
    assert event_types(intent_id) == ["payment_intent.payment_failed"]


@pytest.mark.parametrize("rail", ["sandbox_push", "sandbox_redirect"])
def test_an_unanswered_submit_is_recovered_per_flow(payment_stack, rail):
    # The rail got the submit and its answer was lost (connection closed): the confirm
    # answers processing; the request row says sent, no answer.
    payment_stack.rail.scenario(amount=4007, drop_submits=1)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4007, rail=rail)["id"])
    assert intent["charge"]["status"] == "submitting"
    if rail == "sandbox_push":
        # Push: after the window the worker asks the rail by reference; the rail has it.
        charge = settled(intent["id"], "succeeded")
        assert len(payment_stack.posts(charge["id"])) == 1
        assert event_types(intent["id"]) == ["payment_intent.succeeded"]
    else:
        # Redirect: the pay_token was in the lost answer and no URL was handed out: dead.
        charge = settled(intent["id"], "failed")
        assert charge["failure_code"] == "redirect_never_delivered" and charge["settled_after"] >= 1.5
        assert event_types(intent["id"]) == ["payment_intent.payment_failed"]


def test_a_submit_that_never_arrived_is_resubmitted_after_a_streak_of_404s_spanning_the_window(payment_stack):
    # The rail never received the submit (lost before it): polls answer 404.
    payment_stack.rail.scenario(amount=4008, lose_submits=1)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4008)["id"])
    charge = settled(intent["id"], "succeeded")
    log = payment_stack.rail.requests(charge["id"])
    posts = [i for i, r in enumerate(log) if r["method"] == "POST"]
    assert len(posts) == 2 and log[posts[1]]["idempotency_key"] == charge["id"]  # same reference
    not_found_before_resubmit = [r for r in log[: posts[1]] if r["method"] == "GET" and r["status"] == 404]
    assert len(not_found_before_resubmit) >= 3  # the streak
    # ... and the window: the resubmit went out at least a window after the first 404.
    first_404, resubmitted = sql(
        "SELECT min(sent_at) FILTER (WHERE status_code = 404), max(sent_at) FILTER (WHERE operation = 'submit')"
        " FROM provider_requests WHERE charge_id = %s",
        [charge["id"]],
    )[0]
    assert (resubmitted - first_404).total_seconds() >= 1.5
    assert charge["not_found_count"] == 0  # cleared once the rail had it
    assert event_types(intent["id"]) == ["payment_intent.succeeded"]


def test_a_redirect_submit_that_never_arrived_fails_as_a_dead_order(payment_stack):
    payment_stack.rail.scenario(amount=4009, lose_submits=1)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4009, rail="sandbox_redirect")["id"])
    charge = settled(intent["id"], "failed")
    assert charge["failure_code"] == "redirect_never_delivered"
    assert not payment_stack.polls(charge["id"])


def test_a_push_submit_answered_unreadably_is_polled_to_success_never_failed(payment_stack):
    # The rail took the charge and answered 200 with a body nobody can read.
    payment_stack.rail.scenario(amount=4013, submit_body="")
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4013)["id"])
    assert intent["charge"]["status"] == "submitting"
    charge = settled(intent["id"], "succeeded")
    assert len(payment_stack.posts(charge["id"])) == 1
    assert event_types(intent["id"]) == ["payment_intent.succeeded"]


def test_a_poll_answered_429_waits_for_retry_after_and_is_never_dead_lettered(payment_stack):
    payment_stack.rail.scenario(amount=4014, error_polls=2, error_status=429, retry_after="3")
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4014)["id"])
    charge = settled(intent["id"], "succeeded", timeout=40)
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    gets = sql(
        "SELECT sent_at, status_code FROM provider_requests WHERE charge_id = %s AND operation = 'status' ORDER BY id",
        [charge["id"]],
    )
    assert [code for _, code in gets] == [429, 429, 200]
    # Each ask after a 429 came no sooner than the rail's Retry-After (the ladder here is
    # 0.1 s, and an idle worker looks again within a second).
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(gets)]
    assert min(gaps) >= 2.9, gaps


def test_a_resubmit_the_rail_answers_429_is_no_dead_letter_and_the_poll_resubmits_later(payment_stack):
    # Never received (404s), then the resubmit is rate limited once: still no dead letter.
    payment_stack.rail.scenario(amount=4015, lose_submits=1, error_submits=0)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4015)["id"])
    charge_id = intent["charge"]["id"]
    payment_stack.rail.scenario(reference=charge_id, lose_submits=1, submit_status=429)
    wait_for(
        lambda: len([r for r in payment_stack.posts(charge_id) if r["status"] == 429]) >= 2,
        30,
        message="two rate-limited resubmits",
    )
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    # No resubmit sits on the queue's retry backoff (the road to a dead letter): each 429
    # ended its job, and the poll asked for the next resubmit. (A job on the backoff has its
    # error recorded; last_error is never NULL, and a resubmit the worker is running right
    # now, the rail answering at once, has none.)
    erred = sql(
        "SELECT attempts, deferrals, locked_at IS NOT NULL, last_error FROM jobs"
        " WHERE kind = 'resubmit_charge' AND last_error <> ''"
    )
    assert erred == [], erred  # (attempts, deferrals, leased, last_error): what put it there
    payment_stack.rail.scenario(reference=charge_id)  # the rail takes the next one
    settled(intent["id"], "succeeded", timeout=30)
    assert scalar("SELECT count(*) FROM dead_letters") == 0


# --- the horizon ---------------------------------------------------------------------------


def test_a_rail_answering_503_forever_reaches_unresolved_at_the_horizon_and_a_late_success_settles_it(payment_stack):
    payment_stack.set_policy(VPAY_CHARGE_HORIZON_SECONDS=2.0, VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS=0.4)
    payment_stack.rail.scenario(amount=4010, error_polls=-1)
    worker = payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4010)["id"])
    charge = settled(intent["id"], "unresolved")
    assert scalar(
        "SELECT unresolved_at - created_at >= interval '2 seconds' FROM charges WHERE id = %s", [charge["id"]]
    )
    assert intent_status(intent["id"]) == "processing"  # and says so through charge.status
    first_update = charge["updated_at"]
    # It keeps being polled (every 0.4 s here, hourly by default), re-alerting once per
    # period, without rewriting the row or emitting a second event.
    gets_then = len(payment_stack.polls(charge["id"]))
    alert_keys = "SELECT count(*) FROM alerts WHERE key LIKE %s"
    wait_for(lambda: scalar(alert_keys, [f"charge_unresolved:{charge['id']}:%"]) >= 3, 15, message="re-alerts")
    assert len(payment_stack.polls(charge["id"])) > gets_then
    assert charge_of(intent["id"])["updated_at"] == first_update
    assert event_types(intent["id"]) == ["charge.unresolved"]
    # Each alert is logged once by the worker, with alert=true.
    wait_for(lambda: worker.output().count("is unresolved after") >= 3, 15, message="alert lines")
    alerts = [json.loads(line) for line in worker.output().splitlines() if '"ALERT: Charge' in line]
    assert len(alerts) >= 3 and all(a["alert"] is True and a["details"]["charge_id"] == charge["id"] for a in alerts)
    assert len({a["alert_key"] for a in alerts}) == len(alerts)  # one line per alert, never twice
    # Hundreds of logged rail failures, and the rail's key in none of them.
    assert payment_stack.rail.rails()["sandbox_push"]["api_key"] not in worker.output()
    # The rail recovers: a late success is the normal way an unresolved charge ends.
    payment_stack.rail.scenario(amount=4010, error_polls=0)
    settled(intent["id"], "succeeded", timeout=15)
    assert intent_status(intent["id"]) == "succeeded"
    assert event_types(intent["id"]) == ["charge.unresolved", "payment_intent.succeeded"]


def test_a_redirect_intent_leaves_requires_action_for_processing_when_its_charge_goes_unresolved(payment_stack):
    # docs/architecture.md §8: requires_action -> processing | succeeded | failed. The payer never pays:
    # past the horizon the URL is no action anyone should still be sent to take.
    payment_stack.set_policy(VPAY_CHARGE_HORIZON_SECONDS=2.0, VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS=0.4)
    payment_stack.rail.scenario(amount=4016, after_polls=1_000_000)
    payment_stack.worker()
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4016, rail="sandbox_redirect")["id"])
    assert intent["status"] == "requires_action" and intent["next_action"]["type"] == "redirect_to_url"
    settled(intent["id"], "unresolved")
    shown = payment_stack.acme.call("GET", f"/v1/payment_intents/{intent['id']}").json()
    assert (shown["status"], shown["next_action"], shown["charge"]["status"]) == ("processing", None, "unresolved")
    assert event_types(intent["id"]) == ["charge.unresolved"]
    # A late success still settles it.
    payment_stack.rail.scenario(amount=4016, after_polls=1)
    settled(intent["id"], "succeeded", timeout=15)
    assert intent_status(intent["id"]) == "succeeded"


def test_a_submitting_charge_whose_rail_never_knows_it_is_escalated_at_the_horizon(payment_stack):
    # 404 forever: the resubmit never lands either. Without the horizon above the
    # crash-recovery block this would cycle resubmit -> ladder -> resubmit, never alerting.
    payment_stack.set_policy(VPAY_CHARGE_HORIZON_SECONDS=6.0, VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS=0.4)
    payment_stack.rail.scenario(amount=4011, lose_submits=1000)
    worker = payment_stack.worker()
    # The 6 s horizon must not be spent while the worker boots (seconds on a loaded machine):
    # the charge's first poll would find it past the horizon before any resubmit.
    wait_for(lambda: "worker started" in worker.output(), 60, message="the worker up")
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4011)["id"])
    charge = settled(intent["id"], "unresolved", timeout=30)
    assert event_types(intent["id"]) == ["charge.unresolved"]
    assert len(payment_stack.posts(charge["id"])) >= 2


# --- SIGKILL mid-poll ------------------------------------------------------------------------


def test_killing_the_worker_mid_poll_then_restarting_settles_the_charge_exactly_once(payment_stack):
    payment_stack.set_policy(VPAY_RAIL_TIMEOUT_SECONDS=8.0, VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS=20.0)
    payment_stack.rail.scenario(amount=4012, poll_delay=4.0)
    first = payment_stack.worker("--heartbeat", "0.25")
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4012)["id"])
    charge_id = intent["charge"]["id"]
    # The worker is inside its rail call (the rail holds the answer 4 s): kill it there.
    wait_for(lambda: payment_stack.polls(charge_id), 10, message="the poll")
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    assert charge_of(intent["id"])["status"] == "submitted"
    # The request row the killed poll wrote is still unanswered: the evidence survived.
    assert (
        scalar(
            "SELECT count(*) FROM provider_requests WHERE charge_id = %s AND operation = 'status' AND answered_at IS NULL",
            [charge_id],
        )
        == 1
    )
    payment_stack.rail.scenario(amount=4012)  # the rail answers promptly from now on
    # The replacement's reaper (every half lease) frees the dead worker's lease once it
    # expires (2 s after the claim), and the poll runs again.
    payment_stack.worker("--heartbeat", "1")
    settled(intent["id"], "succeeded")
    time.sleep(1.0)
    assert event_types(intent["id"]) == ["payment_intent.succeeded"]
    assert (
        scalar("SELECT count(*) FROM events WHERE data->>'id' = %s AND type = 'payment_intent.succeeded'", [intent["id"]])
        == 1
    )


# --- the backstop ----------------------------------------------------------------------------


def test_the_backstop_re_enqueues_a_poll_for_a_live_charge_that_lost_its_job(payment_stack):
    payment_stack.set_policy(VPAY_CHARGE_BACKSTOP_SECONDS=600)
    intent = payment_stack.acme.confirm(payment_stack.acme.intent(amount=4013)["id"])
    charge_id = intent["charge"]["id"]
    sql("DELETE FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge_id}"])  # the job is lost
    sql("DELETE FROM jobs WHERE dedupe_key = 'singleton:scan_live_charges'")  # the boot seed runs the scan now
    payment_stack.worker()
    settled(intent["id"], "succeeded")
    assert event_types(intent["id"]) == ["payment_intent.succeeded"]
