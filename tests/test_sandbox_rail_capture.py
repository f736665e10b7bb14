"""The sandbox rail's authorize-then-capture and void (``sandbox/rail.py``'s protocol),
spoken over plain HTTP to the real rail process."""

from __future__ import annotations

import httpx
import pytest

from tests.rail_support import API_KEY, sandbox_rail  # noqa: F401

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def http(sandbox_rail):  # noqa: F811
    with httpx.Client(base_url=sandbox_rail.url, headers=AUTH, timeout=5) as client:
        yield client


def submit(http, reference, amount=5000, *, capture=False, rail="push") -> dict:
    body = {"reference": reference, "amount": amount, "currency": "EUR"}
    if capture is not None:
        body["capture"] = capture
    answer = http.post(f"/{rail}/charges", json=body, headers={"Idempotency-Key": reference})
    assert answer.status_code == 200, answer.text
    return answer.json()


def poll(http, reference, rail="push", pay_token=None) -> httpx.Response:
    return http.get(f"/{rail}/charges/{reference}", params={"pay_token": pay_token} if pay_token else None)


def capture(http, reference, amount, rail="push") -> httpx.Response:
    key = {"Idempotency-Key": f"{reference}:capture"}
    return http.post(f"/{rail}/charges/{reference}/capture", json={"amount": amount}, headers=key)


def void(http, reference, rail="push") -> httpx.Response:
    return http.post(f"/{rail}/charges/{reference}/void", headers={"Idempotency-Key": f"{reference}:void"})


def refund(http, reference, charge_reference, amount) -> httpx.Response:
    body = {"reference": reference, "charge_reference": charge_reference, "amount": amount, "currency": "EUR"}
    return http.post("/push/refunds", json=body, headers={"Idempotency-Key": reference})


def authorized(http, reference, amount=5000) -> None:
    submit(http, reference, amount)
    assert poll(http, reference).json()["status"] == "authorized"


def test_an_authorization_is_captured_in_part_once_however_often_asked(http, sandbox_rail):  # noqa: F811
    assert submit(http, "a1")["status"] == "pending"
    assert poll(http, "a1").json() == {"status": "authorized", "reference": "a1", "amount_capturable": 5000}
    first = capture(http, "a1", 3000)
    assert (first.status_code, first.json()) == (
        200,
        {"reference": "a1", "status": "succeeded", "amount_captured": 3000},
    )
    again = capture(http, "a1", 4000)  # the same capture: nothing more taken
    assert (again.status_code, again.json()) == (200, first.json())
    assert poll(http, "a1").json() == {"status": "succeeded", "reference": "a1", "amount_captured": 3000}
    held = sandbox_rail.charge("a1")
    assert (held["capture"], held["settled"], held["amount_captured"], held["captures"]) == (
        False,
        "succeeded",
        3000,
        2,
    )
    logged = [r for r in sandbox_rail.requests("a1") if r.get("kind") == "capture"]
    assert [(r["idempotency_key"], r["status"], r["answered"]) for r in logged] == [("a1:capture", 200, True)] * 2


def test_a_capture_before_the_authorization_or_above_it_is_refused(http, sandbox_rail):  # noqa: F811
    sandbox_rail.scenario(reference="a2", after_polls=2)
    submit(http, "a2")
    assert capture(http, "a2", 5000).status_code == 400
    assert poll(http, "a2").json()["status"] == "pending"
    assert capture(http, "a2", 5000).json() == {"error": "charge not authorized yet"}
    assert poll(http, "a2").json()["status"] == "authorized"
    assert capture(http, "a2", 5001).status_code == 400
    assert capture(http, "a2", 0).status_code == 400
    assert capture(http, "a2", 5000).json()["amount_captured"] == 5000


def test_a_charge_captured_on_submit_is_no_authorization(http):
    submit(http, "c1", capture=None)
    assert poll(http, "c1").json() == {"status": "succeeded", "reference": "c1"}  # as ever
    assert capture(http, "c1", 5000).status_code == 400
    bad = http.post("/push/charges", json={"reference": "c2", "amount": 1, "currency": "EUR", "capture": "no"})
    assert bad.status_code == 400


def test_a_void_releases_a_pending_or_authorized_charge_for_good(http, sandbox_rail):  # noqa: F811
    pending = submit(http, "v1", rail="redirect")
    assert void(http, "v1", "redirect").json() == {"reference": "v1", "status": "canceled"}
    assert httpx.get(pending["redirect_url"]).status_code == 404  # the payer can no longer pay it
    assert capture(http, "v1", 5000, "redirect").status_code == 400
    assert poll(http, "v1", "redirect", pending["pay_token"]).json()["status"] == "canceled"

    paid = submit(http, "v2", rail="redirect")
    assert httpx.get(paid["redirect_url"]).status_code == 200  # the payer approves: authorized at once
    assert sandbox_rail.charge("v2")["settled"] == "authorized"
    assert void(http, "v2", "redirect").json()["status"] == "canceled"
    assert capture(http, "v2", 5000, "redirect").json() == {"error": "charge was voided"}
    assert void(http, "v2", "redirect").json() == {"reference": "v2", "status": "canceled"}
    assert sandbox_rail.charge("v2")["voids"] == 2

    submit(http, "v3", capture=None)  # a pending automatic charge is voidable too
    assert void(http, "v3").json()["status"] == "canceled"
    assert poll(http, "v3").json()["status"] == "canceled"


def test_a_void_of_a_settled_charge_answers_what_the_rail_answered(http):
    submit(http, "s1", capture=None)
    assert poll(http, "s1").json()["status"] == "succeeded"
    assert void(http, "s1").json() == {"reference": "s1", "status": "succeeded", "amount_captured": 5000}
    authorized(http, "s2")
    capture(http, "s2", 1200)
    assert void(http, "s2").json() == {"reference": "s2", "status": "succeeded", "amount_captured": 1200}
    submit(http, "s3", 1402)  # built in: fails insufficient_funds
    assert poll(http, "s3").json()["status"] == "failed"
    assert void(http, "s3").json() == {"reference": "s3", "status": "failed", "failure_code": "insufficient_funds"}


def test_unknown_references_and_missing_keys(http, sandbox_rail):  # noqa: F811
    assert (void(http, "nope").status_code, void(http, "nope").json()) == (404, {"error": "not found"})
    assert capture(http, "nope", 100).status_code == 404
    authorized(http, "k1")
    assert httpx.post(f"{sandbox_rail.url}/push/charges/k1/capture", json={"amount": 1}).status_code == 401
    assert httpx.post(f"{sandbox_rail.url}/push/charges/k1/void").status_code == 401


def test_an_errored_capture_captures_nothing(http, sandbox_rail):  # noqa: F811
    sandbox_rail.scenario(reference="e1", capture_error=1, error_status=429)
    authorized(http, "e1")
    assert capture(http, "e1", 5000).status_code == 429
    assert sandbox_rail.charge("e1")["amount_captured"] is None
    assert capture(http, "e1", 5000).json()["amount_captured"] == 5000


def test_a_dropped_capture_is_applied_and_its_answer_lost(http, sandbox_rail):  # noqa: F811
    sandbox_rail.scenario(reference="d1", capture_drop=1)
    authorized(http, "d1")
    with pytest.raises(httpx.TransportError):
        capture(http, "d1", 2500)
    assert (sandbox_rail.charge("d1")["settled"], sandbox_rail.charge("d1")["amount_captured"]) == ("succeeded", 2500)
    assert capture(http, "d1", 2500).json() == {"reference": "d1", "status": "succeeded", "amount_captured": 2500}
    logged = [r for r in sandbox_rail.requests("d1") if r.get("kind") == "capture"]
    assert [(r["status"], r["answered"]) for r in logged] == [(None, False), (200, True)]


def test_a_dropped_void_is_applied_and_its_answer_lost(http, sandbox_rail):  # noqa: F811
    sandbox_rail.scenario(reference="d2", void_drop=1)
    authorized(http, "d2")
    with pytest.raises(httpx.TransportError):
        void(http, "d2")
    assert sandbox_rail.charge("d2")["settled"] == "canceled"
    assert void(http, "d2").json()["status"] == "canceled"


def test_refunds_of_an_authorization_wait_for_its_capture_and_are_bounded_by_it(http):
    submit(http, "r1")
    assert refund(http, "rf0", "r1", 100).json() == {"error": "charge not captured"}
    poll(http, "r1")
    assert refund(http, "rf0", "r1", 100).status_code == 400  # authorized: still not captured
    capture(http, "r1", 3000)
    assert refund(http, "rf1", "r1", 2000).status_code == 200
    assert refund(http, "rf2", "r1", 1001).json() == {"error": "refunds would exceed the charge"}
    assert refund(http, "rf2", "r1", 1000).status_code == 200


def test_refunds_of_an_automatic_charge_are_as_before(http):
    submit(http, "r2", capture=None)
    assert refund(http, "rf3", "r2", 4000).json() == {"reference": "rf3", "status": "pending"}  # before any poll
    assert refund(http, "rf4", "r2", 1001).status_code == 400
    submit(http, "r3", capture=None)
    void(http, "r3")
    assert refund(http, "rf5", "r3", 1).json() == {"error": "charge not captured"}
