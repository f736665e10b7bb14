"""A rail's guards (charges/services/rail_gate.py) on the shipping code paths: the breaker
opening under the poll, deferring polls without a request, probing, escalating past the
horizon, refusing a confirm before it writes; the ceiling of requests in flight shared
across connections; the worker's share. The in-process worker loop (``Worker.run_once``)
against the sandbox rail over HTTP and the real database."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from django.db import IntegrityError, connection

from charges import request_log
from charges.models import RequestOperation
from charges.services import rail_calls, rail_gate
from charges.services.rail_gate import SHARES, RailDeferred
from jobs.models import Breaker, DeadLetter
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, Merchant, apply_policy, charge_of, events, scalar, sql, use_rails
from tests.rail_support import API_KEY
from tests.test_charges_poll import job_of, live_charge

pytestmark = pytest.mark.django_db(transaction=True)

FAILURES = 3


@pytest.fixture
def merchant(settings, tmp_path, sandbox_rail):
    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS": 30.0})
    settings.VPAY_RAIL_BREAKER_FAILURES = FAILURES
    settings.VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS = 60.0
    use_rails(settings, tmp_path, sandbox_rail.rails())
    from merchants.services import create_merchant

    return create_merchant("Guards Ltd")[0]


def known_charge(merchant, sandbox_rail, *, amount: int = 5000, **kw):
    """A submitted charge the sandbox rail holds (submitted to it over its protocol)."""
    charge = live_charge(merchant, status="submitted", amount=amount, **kw)
    body = json.dumps({"reference": charge.id, "amount": amount, "currency": "usd"}).encode()
    request = urllib.request.Request(
        f"{sandbox_rail.url}/push/charges",
        data=body,
        headers={
            "Authorization": f"Bearer {API_KEY}",
            "Idempotency-Key": charge.id,
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=5):
        pass
    return charge


def breaker(code: str = "sandbox_push") -> Breaker | None:
    return Breaker.objects.filter(name=f"rail:{code}").first()


def poll_now(charge_id: str) -> None:
    sql("UPDATE jobs SET run_at = now() WHERE dedupe_key = %s", [f"charge:poll:{charge_id}"])
    assert Worker().run_once() == 1


def requests_of(charge_id: str) -> int:
    return scalar("SELECT count(*) FROM provider_requests WHERE charge_id = %s", [charge_id])


def cool_down_over(code: str = "sandbox_push") -> None:
    sql("UPDATE breakers SET opened_at = now() - interval '61 seconds' WHERE name = %s", [f"rail:{code}"])


def park_poll(charge_id: str) -> None:
    """Its next poll an hour out: Worker.run_once() in poll_now() claims the earliest due job,
    and the failing charge's next rung (0.2 s) would be due before the poll a test makes due
    whenever the machine is slow."""
    sql("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = %s", [f"charge:poll:{charge_id}"])


def open_the_rails_breaker(merchant, sandbox_rail) -> None:
    sandbox_rail.scenario(amount=5503, error_polls=-1)
    failing = known_charge(merchant, sandbox_rail, amount=5503)
    for _ in range(FAILURES):
        poll_now(failing.id)
    assert breaker().state == "open"
    park_poll(failing.id)


def test_consecutive_503s_on_polls_open_the_rails_breaker_and_the_next_poll_is_deferred_unsent(merchant, sandbox_rail):
    sandbox_rail.scenario(amount=5503, error_polls=-1)
    failing = known_charge(merchant, sandbox_rail, amount=5503)
    for n in range(1, FAILURES):
        poll_now(failing.id)
        assert (breaker().state, breaker().failures) == ("closed", n)
    poll_now(failing.id)
    assert (breaker().state, breaker().failures) == ("open", FAILURES)
    assert "HTTP 503" in breaker().last_error
    park_poll(failing.id)

    other = known_charge(merchant, sandbox_rail, amount=5000)  # a healthy charge, same rail
    poll_now(other.id)
    assert requests_of(other.id) == 0  # no row
    assert [r for r in sandbox_rail.requests(other.id) if r["method"] == "GET"] == []  # nothing sent
    attempts, deferrals, last_error = sql(
        "SELECT attempts, deferrals, last_error FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{other.id}"]
    )[0]
    assert (attempts, deferrals) == (0, 1) and "breaker rail:sandbox_push is open" in last_error
    assert charge_of(other.intent_id)["status"] == "submitted"


def test_a_refusal_is_an_answer_and_resets_the_count(merchant, sandbox_rail):
    sandbox_rail.scenario(amount=5503, error_polls=2)
    charge = known_charge(merchant, sandbox_rail, amount=5503)
    poll_now(charge.id)
    poll_now(charge.id)
    assert breaker().failures == 2
    poll_now(charge.id)  # the rail answers (succeeded)
    assert (breaker().state, breaker().failures) == ("closed", 0)


def test_after_the_cool_down_one_poll_probes_and_its_answer_closes_the_breaker(merchant, sandbox_rail):
    open_the_rails_breaker(merchant, sandbox_rail)
    cool_down_over()
    healthy = known_charge(merchant, sandbox_rail, amount=5000)
    poll_now(healthy.id)
    assert charge_of(healthy.intent_id)["status"] == "succeeded"
    assert (breaker().state, breaker().failures) == ("closed", 0)


def test_a_probe_that_fails_reopens_the_breaker(merchant, sandbox_rail):
    open_the_rails_breaker(merchant, sandbox_rail)
    first_opened = breaker().opened_at
    cool_down_over()
    still_failing = known_charge(merchant, sandbox_rail, amount=5503)
    poll_now(still_failing.id)
    assert breaker().state == "open" and breaker().opened_at > first_opened
    assert requests_of(still_failing.id) == 1  # the probe went out


def test_a_poll_at_its_deferral_ceiling_takes_its_next_rung_instead_of_a_dead_letter(merchant, sandbox_rail):
    open_the_rails_breaker(merchant, sandbox_rail)
    charge = known_charge(merchant, sandbox_rail, amount=5000)
    sql("UPDATE jobs SET deferrals = 100 WHERE dedupe_key = %s", [f"charge:poll:{charge.id}"])  # the kind's ceiling
    poll_now(charge.id)
    assert DeadLetter.objects.count() == 0
    deferrals, last_error = sql(
        "SELECT deferrals, last_error FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge.id}"]
    )[0]
    assert deferrals == 0 and "deferral ceiling reached" in last_error
    assert requests_of(charge.id) == 0


def test_past_the_horizon_a_poll_the_breaker_holds_back_escalates_the_charge(merchant, settings, sandbox_rail):
    open_the_rails_breaker(merchant, sandbox_rail)
    settings.VPAY_CHARGE_HORIZON_SECONDS = 3600.0
    old = known_charge(merchant, sandbox_rail, age=7200.0)
    poll_now(old.id)
    assert charge_of(old.intent_id)["status"] == "unresolved"
    assert [t for t, _ in events(old.id)] == ["charge.unresolved"]
    assert requests_of(old.id) == 0
    due_in, _ = job_of(old.id)
    assert due_in == pytest.approx(0.5, abs=0.3)  # polled on the past-horizon period


def test_a_confirm_on_an_open_breaker_is_refused_with_a_503_before_anything_is_written(merchant, sandbox_rail):
    open_the_rails_breaker(merchant, sandbox_rail)
    acme = Merchant("Acme")
    intent = acme.intent(amount=5000)
    refused = acme.call("POST", f"/v1/payment_intents/{intent['id']}/confirm", **{"Idempotency-Key": "k1"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "rail_unavailable"
    assert 1 <= int(refused["Retry-After"]) <= 76
    assert scalar("SELECT status FROM payment_intents WHERE id = %s", [intent["id"]]) == "requires_confirmation"
    assert scalar("SELECT count(*) FROM charges WHERE intent_id = %s", [intent["id"]]) == 0
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_charge' AND payload->>'charge_id' IS NULL") == 0
    # The rail recovers: the same confirm, under the same key, goes through as the probe.
    cool_down_over()
    again = acme.call("POST", f"/v1/payment_intents/{intent['id']}/confirm", **{"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["status"] == "processing"
    assert breaker().state == "closed"


def test_the_checkout_pages_pay_button_on_an_open_breaker_offers_the_button_again_with_the_reason(
    merchant, sandbox_rail
):
    from urllib.parse import urlsplit

    from django.test import Client

    open_the_rails_breaker(merchant, sandbox_rail)
    session = (
        Merchant("Acme")
        .call("POST", "/v1/checkout/sessions", {"amount": 5000, "currency": "usd", "rail": "sandbox_push"})
        .json()
    )
    path = urlsplit(session["url"]).path
    client = Client()
    token = client.get(path).context["csrf_token"]
    refused = client.post(path + "/pay", {"csrfmiddlewaretoken": str(token)})
    html = refused.content.decode()
    assert refused.status_code == 503 and 1 <= int(refused["Retry-After"]) <= 76
    assert 'data-page="pay"' in html and 'id="error"' in html and "nothing was charged" in html
    assert scalar("SELECT count(*) FROM charges WHERE intent_id = %s", [session["payment_intent"]]) == 0
    assert scalar("SELECT status FROM payment_intents WHERE id = %s", [session["payment_intent"]]) == (
        "requires_confirmation"
    )


def test_a_confirm_the_rail_does_not_answer_counts_towards_the_breaker(merchant, sandbox_rail):
    sandbox_rail.scenario(amount=5777, error_submits=10)
    acme = Merchant("Acme")
    for _ in range(FAILURES):
        acme.confirm(acme.intent(amount=5777)["id"])
    assert breaker().state == "open"


def record_within_ceiling(charge_id: str, operation=RequestOperation.STATUS, *, ceiling: int = 5):
    """A status request row for ``charge_id`` through the ceiling (one rail, a 30 s bound)."""
    return request_log.record_sent_within_ceiling(
        charge_id,
        operation,
        rail="sandbox_push",
        method="GET",
        path="/charges/x",
        idempotency_key=None,
        ceiling=ceiling,
        bound_seconds=30.0,
    )


def test_the_ceiling_admits_exactly_its_number_of_concurrent_requests_across_connections(merchant):
    charge = live_charge(merchant, status="submitted", job=False)
    barrier, got = threading.Barrier(6), []

    def send():
        try:
            barrier.wait(5)
            got.append(record_within_ceiling(charge.id, ceiling=2)[0])
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert len(got) == 6 and sum(1 for r in got if r is not None) == 2
    assert requests_of(charge.id) == 2


def test_a_request_row_that_fails_mid_transaction_leaves_no_transaction_open_behind_it(merchant):
    # The ceiling's lock, count, insert and commit are one round trip; a statement failing
    # inside it leaves the explicit transaction aborted, and the connection must not carry
    # it into the caller's next statement.
    charge = live_charge(merchant, status="submitted", job=False)
    with pytest.raises(IntegrityError):
        record_within_ceiling(charge.id, "bogus")  # refused by the operation's check constraint, mid-string
    request_id, _, _ = record_within_ceiling(charge.id)
    assert request_id is not None and requests_of(charge.id) == 1


def test_a_poll_over_the_ceiling_defers_and_a_crashed_workers_row_stops_holding_a_slot(
    merchant, settings, sandbox_rail
):
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    in_flight = live_charge(merchant, status="submitted", job=False)
    request_log.record_sent(  # a request out and unanswered: it holds the one slot
        in_flight.id, RequestOperation.STATUS, rail="sandbox_push", method="GET", path="/x", idempotency_key=None
    )
    charge = known_charge(merchant, sandbox_rail, amount=5000)
    poll_now(charge.id)
    assert requests_of(charge.id) == 0
    assert "has its ceiling (1) in flight" in job_of(charge.id)[1]
    # Past the rail timeout plus the margin the row is a dead worker's, and frees its slot.
    bound = settings.VPAY_RAIL_TIMEOUT_SECONDS + rail_calls.IN_FLIGHT_MARGIN_SECONDS
    sql("UPDATE provider_requests SET sent_at = now() - make_interval(secs => %s)", [bound + 1])
    poll_now(charge.id)
    assert charge_of(charge.intent_id)["status"] == "succeeded"


def test_a_rail_holding_the_workers_share_of_threads_defers_the_next_request(merchant, sandbox_rail):
    charge = known_charge(merchant, sandbox_rail, job=False)
    assert SHARES.acquire("sandbox_push", 1)  # another executor of this worker is inside a call
    try:
        with pytest.raises(RailDeferred, match="share"):
            rail_calls.status(charge.id, rail_gate_rail(), pay_token=None, share=1)
    finally:
        SHARES.release("sandbox_push")
    assert requests_of(charge.id) == 0
    assert rail_calls.status(charge.id, rail_gate_rail(), pay_token=None, share=1).http_status == 200


def test_a_probe_refused_by_the_ceiling_hands_its_turn_to_the_next_caller(merchant, sandbox_rail, settings):
    open_the_rails_breaker(merchant, sandbox_rail)
    cool_down_over()
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 0
    charge = live_charge(merchant, status="submitted", job=False)
    with pytest.raises(RailDeferred, match="ceiling"):
        rail_calls.status(charge.id, rail_gate_rail(), pay_token=None)
    assert breaker().state == "open"  # not half-open with a probe nobody sent
    assert rail_gate.admit("sandbox_push").probe


def rail_gate_rail():
    from charges.rails import get_rail

    return get_rail("sandbox_push")
