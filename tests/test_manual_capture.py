"""Authorize now, capture later, against the real sandbox rail with the worker run in
process: the authorization, a partial capture and what it bounds, a cancel that voids, the
expiry, and the capture's recovery when its answer is lost or it never landed (one capture
at the rail, however the worker was interrupted)."""

from __future__ import annotations

import time

import httpx
import pytest

from charges.models import Charge, PaymentIntent
from tests.charges_support import run_worker_until, scalar, sql
from tests.rail_support import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def intent_row(intent_id: str) -> PaymentIntent:
    return PaymentIntent.objects.select_related("charge").get(pk=intent_id)


def events_of(intent_id: str, charge_id: str) -> list[str]:
    return [
        t
        for (t,) in sql(
            "SELECT type FROM events WHERE data->>'id' IN (%s, %s) ORDER BY created_at, id", [intent_id, charge_id]
        )
    ]


def rail_charge(rail, charge_id: str) -> dict:
    return rail._get(f"/__admin/charges/{charge_id}")


def captures_at_rail(rail, charge_id: str) -> list[dict]:
    return [r for r in rail.requests(charge_id) if r.get("kind") == "capture"]


def authorized(acme, amount: int = 5000) -> PaymentIntent:
    """A manual-capture intent the rail authorized (the worker's poll heard it)."""
    made = acme.intent(amount=amount, capture_method="manual")
    assert made["capture_method"] == "manual" and made["amount_capturable"] == 0
    acme.confirm(made["id"])
    run_worker_until(lambda: intent_row(made["id"]).status == "requires_capture")
    return intent_row(made["id"])


def test_an_authorization_waits_for_its_capture_which_takes_part_and_bounds_the_refunds(acme_api, rails):
    intent = authorized(acme_api)
    charge = intent.charge
    assert (charge.status, charge.manual_capture, intent.amount_capturable) == ("authorized", True, 5000)
    assert rail_charge(rails, charge.id)["settled"] == "authorized"
    # Nothing more to ask the rail: the poll waits for the authorization's expiry (7 days).
    wait = scalar(
        "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge.id}"]
    )
    assert 6.9 * 86400 < wait <= 7 * 86400

    answer = acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {"amount_to_capture": 3000})
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "processing" and answer.json()["charge"]["status"] == "capturing"
    run_worker_until(lambda: intent_row(intent.id).status == "succeeded")

    intent = intent_row(intent.id)
    assert (intent.amount_received, intent.amount_capturable, intent.charge.amount_captured) == (3000, 0, 3000)
    (capture,) = captures_at_rail(rails, charge.id)
    assert capture["idempotency_key"] == f"{charge.id}:capture" and capture["body"] == {"amount": 3000}
    assert rail_charge(rails, charge.id)["amount_captured"] == 3000
    assert events_of(intent.id, charge.id) == [
        "payment_intent.created",
        "payment_intent.processing",
        "payment_intent.amount_capturable_updated",
        "payment_intent.processing",
        "charge.captured",
        "payment_intent.succeeded",
    ]
    assert scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge.id}"]) == 0
    # Refunds are bounded by what was captured, not by the amount authorized.
    too_much = acme_api.refund(intent.id, amount=3001)
    assert too_much.status_code == 400 and too_much.json()["error"]["code"] == "amount_too_large"
    assert acme_api.refund(intent.id).json()["amount"] == 3000


def test_a_capture_is_refused_above_what_is_capturable_and_in_any_other_state(acme_api, rails):
    intent = authorized(acme_api, amount=2000)
    capture = f"/v1/payment_intents/{intent.id}/capture"
    too_much = acme_api.call("POST", capture, {"amount_to_capture": 2001})
    assert (too_much.status_code, too_much.json()["error"]["code"]) == (400, "amount_too_large")
    fresh = acme_api.intent(amount=1000, capture_method="manual")
    early = acme_api.call("POST", f"/v1/payment_intents/{fresh['id']}/capture", {})
    assert (early.status_code, early.json()["error"]["code"]) == (409, "payment_intent_unexpected_state")
    assert acme_api.call("POST", capture, {}).status_code == 200
    twice = acme_api.call("POST", capture, {})
    assert (twice.status_code, twice.json()["error"]["code"]) == (409, "payment_intent_unexpected_state")
    assert Charge.objects.get(pk=intent.charge.id).amount_to_capture == 2000  # all of it, by default


def test_a_cancel_of_an_authorization_voids_it_at_the_rail(acme_api, rails):
    intent = authorized(acme_api)
    answer = acme_api.call("POST", f"/v1/payment_intents/{intent.id}/cancel", {"cancellation_reason": "abandoned"})
    assert answer.status_code == 200, answer.content
    assert (answer.json()["status"], answer.json()["charge"]["status"]) == ("canceled", "voiding")
    run_worker_until(lambda: Charge.objects.get(pk=intent.charge.id).status == "voided")
    assert rail_charge(rails, intent.charge.id)["settled"] == "canceled"
    assert events_of(intent.id, intent.charge.id)[-1] == "payment_intent.canceled"
    late = acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    assert late.status_code == 409
    # A merchant cannot claim the reason vpay gives an expired authorization.
    other = authorized(acme_api)
    refused = acme_api.call("POST", f"/v1/payment_intents/{other.id}/cancel", {"cancellation_reason": "expired"})
    assert refused.status_code == 400


def test_an_authorization_left_uncaptured_expires_and_is_voided(acme_api, rails, settings):
    settings.VPAY_AUTHORIZATION_EXPIRY_SECONDS = 1.0
    intent = authorized(acme_api)
    run_worker_until(lambda: Charge.objects.get(pk=intent.charge.id).status == "voided")
    intent = intent_row(intent.id)
    assert (intent.status, intent.cancellation_reason, intent.amount_capturable) == ("canceled", "expired", 0)
    assert rail_charge(rails, intent.charge.id)["settled"] == "canceled"
    assert events_of(intent.id, intent.charge.id)[-1] == "payment_intent.canceled"


def test_a_capture_whose_answer_was_lost_is_asked_about_never_sent_again(acme_api, rails):
    intent = authorized(acme_api)
    rails.scenario(reference=intent.charge.id, capture_drop=1)  # applied, the answer lost
    acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    run_worker_until(lambda: intent_row(intent.id).status == "succeeded")
    assert len(captures_at_rail(rails, intent.charge.id)) == 1
    operations = [
        op
        for (op,) in sql("SELECT operation FROM provider_requests WHERE charge_id = %s ORDER BY id", [intent.charge.id])
    ]
    assert operations[-2:] == ["capture", "status"]  # the lost answer, then the rail's word


def test_a_capture_that_never_landed_is_sent_again_only_a_window_after_the_first(acme_api, rails):
    intent = authorized(acme_api)
    rails.scenario(reference=intent.charge.id, capture_error=1)  # a 503: nothing captured
    acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    began = time.monotonic()
    run_worker_until(lambda: intent_row(intent.id).status == "succeeded")
    captures = captures_at_rail(rails, intent.charge.id)
    assert [c["status"] for c in captures] == [503, 200]
    # The resend waited out the not-found window (1.5 s here), asking the rail meanwhile.
    assert time.monotonic() - began >= 1.5
    assert rail_charge(rails, intent.charge.id)["amount_captured"] == 5000


def test_a_capture_the_rail_refuses_leaves_the_authorization_capturable_and_a_new_one_has_its_own_key(acme_api, rails):
    intent = authorized(acme_api)
    charge_id = intent.charge.id
    rails.scenario(reference=charge_id, capture_refuse=2)  # 400s; the rail still holds the authorization
    acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    run_worker_until(lambda: intent_row(intent.id).status == "requires_capture")
    charge = Charge.objects.get(pk=charge_id)
    assert (charge.status, charge.failure_code) == ("authorized", "capture_refused")
    assert scalar("SELECT count(*) FROM alerts WHERE key = %s", [f"charge_capture_refused:{charge_id}:0"]) == 1
    # The refusal was judged by the status read after it, and the poll waits for the expiry again.
    assert [
        op for (op,) in sql("SELECT operation FROM provider_requests WHERE charge_id = %s ORDER BY id", [charge_id])
    ][-2:] == ["capture", "status"]
    run_worker_until(
        lambda: scalar(
            "SELECT run_at > now() + interval '6 days' FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge_id}"]
        )
    )

    # Asked for again, it is a first send (not a refused resend, which would prove nothing),
    # refused and told again; and the third time, under a key of its own, it captures.
    assert acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {}).status_code == 200
    run_worker_until(lambda: intent_row(intent.id).status == "requires_capture")
    assert scalar("SELECT count(*) FROM alerts WHERE key = %s", [f"charge_capture_refused:{charge_id}:1"]) == 1
    assert (
        acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {"amount_to_capture": 1000}).status_code
        == 200
    )
    run_worker_until(lambda: intent_row(intent.id).status == "succeeded")
    keys = [c["idempotency_key"] for c in captures_at_rail(rails, charge_id)]
    assert keys == [f"{charge_id}:capture", f"{charge_id}:capture:1", f"{charge_id}:capture:2"]
    assert intent_row(intent.id).amount_received == 1000


def test_a_capture_finding_the_authorization_gone_cancels_the_intent_with_an_alert(acme_api, rails):
    intent = authorized(acme_api)
    # The rail released the hold on its own (its expiry, a dispute desk): it refuses the capture.
    released = httpx.post(
        f"{rails.url}/push/charges/{intent.charge.id}/void", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert released.json()["status"] == "canceled"
    acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    run_worker_until(lambda: Charge.objects.get(pk=intent.charge.id).status == "voided")
    intent = intent_row(intent.id)
    assert (intent.status, intent.cancellation_reason, intent.charge.failure_code) == (
        "canceled",
        "expired",
        "authorization_canceled",
    )
    assert scalar("SELECT count(*) FROM alerts WHERE key = %s", [f"charge_capture_lapsed:{intent.charge.id}:0"]) == 1
    assert events_of(intent.id, intent.charge.id)[-1] == "payment_intent.canceled"


def test_a_refund_of_an_intent_an_older_worker_settled_repairs_what_it_received(acme_api):
    intent_id = acme_api.paid_intent(amount=1000)
    # As a worker of the release before manual capture settles it: nothing recorded as received.
    sql("UPDATE payment_intents SET amount_received = 0 WHERE id = %s", [intent_id])
    assert acme_api.refund(intent_id, amount=400).status_code == 200
    assert scalar("SELECT amount_received FROM payment_intents WHERE id = %s", [intent_id]) == 1000


def test_a_void_that_finds_the_money_captured_records_a_late_success_and_pages(acme_api, rails):
    intent = authorized(acme_api)
    charge_id = intent.charge.id
    # The rail captured it (an operator at the rail's console, a capture vpay never sent).
    taken = httpx.post(
        f"{rails.url}/push/charges/{charge_id}/capture",
        json={"amount": 5000},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert taken.json()["status"] == "succeeded"
    assert acme_api.call("POST", f"/v1/payment_intents/{intent.id}/cancel", {}).status_code == 200
    run_worker_until(lambda: Charge.objects.get(pk=charge_id).status == "succeeded")
    charge = Charge.objects.get(pk=charge_id)
    assert charge.amount_captured == 5000 and intent_row(intent.id).status == "canceled"  # never lost, told once
    assert scalar("SELECT severity FROM alerts WHERE key = %s", [f"charge_late_success:{charge_id}:0"]) == "page"


def test_a_capture_without_a_final_answer_past_its_horizon_alerts_and_stays_capturing(acme_api, rails, settings):
    intent = authorized(acme_api)
    charge_id = intent.charge.id
    settings.VPAY_CHARGE_HORIZON_SECONDS = 1.0  # from when the capture was asked for
    rails.scenario(reference=charge_id, capture_error=1000, error_polls=1000)  # no answer at all
    acme_api.call("POST", f"/v1/payment_intents/{intent.id}/capture", {})
    run_worker_until(
        lambda: scalar("SELECT count(*) FROM alerts WHERE key LIKE %s", [f"charge_capture_unresolved:{charge_id}:%"])
    )
    assert Charge.objects.get(pk=charge_id).status == "capturing"  # a late answer still ends it
    wait = scalar(
        "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{charge_id}"]
    )
    assert 0 < wait <= settings.VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS  # asked again on the past-horizon period
