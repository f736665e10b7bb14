"""``POST /v1/payment_intents/{id}/cancel`` against the real database and the sandbox rail,
and the cancel/confirm race run with real concurrent connections."""

from __future__ import annotations

import pytest

from tests.charges_support import FAST_POLICY, apply_policy, charge_of, events, intent_status, scalar, sql, use_rails
from tests.refund_support import RefundingMerchant, RowLock, race

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme(settings, tmp_path, sandbox_rail):
    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_CONFIRM_GRACE_SECONDS": 30.0})
    use_rails(settings, tmp_path, sandbox_rail.rails())
    return RefundingMerchant("Acme")


def error_of(response) -> dict:
    return response.json()["error"]


def cancel(merchant, intent_id: str, body=None, **kw):
    return merchant.call("POST", f"/v1/payment_intents/{intent_id}/cancel", body, **kw)


def test_an_unconfirmed_intent_is_canceled_with_one_event(acme):
    intent_id = acme.intent()["id"]
    response = cancel(acme, intent_id, {"cancellation_reason": "abandoned"})
    assert response.status_code == 200, response.content
    got = response.json()
    assert (got["status"], got["cancellation_reason"], got["charge"]) == ("canceled", "abandoned", None)
    assert isinstance(got["canceled_at"], int)
    assert intent_status(intent_id) == "canceled"
    ((type_, data),) = events(intent_id)
    assert type_ == "payment_intent.canceled" and data["status"] == "canceled"
    # Final: it cannot be confirmed, canceled again, or refunded.
    confirm = acme.call("POST", f"/v1/payment_intents/{intent_id}/confirm")
    assert confirm.status_code == 409 and "canceled" in error_of(confirm)["message"]
    again = cancel(acme, intent_id)
    assert again.status_code == 409 and error_of(again)["code"] == "payment_intent_unexpected_state"
    assert acme.refund(intent_id).status_code == 409
    assert charge_of(intent_id) is None and len(events(intent_id)) == 1
    listed = acme.call("GET", "/v1/payment_intents?status=canceled").json()["data"]
    assert [i["id"] for i in listed] == [intent_id]


@pytest.mark.parametrize("rail", ["sandbox_push", "sandbox_redirect"])
def test_once_a_charge_is_live_the_cancel_is_a_409_saying_why_and_changes_nothing(acme, rail):
    intent = acme.confirm(acme.intent(rail=rail)["id"])
    response = cancel(acme, intent["id"])
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "payment_intent_unexpected_state" and error["type"] == "invalid_request_error"
    assert "charge is live at the rail" in error["message"] and intent["status"] in error["message"]
    assert intent_status(intent["id"]) == intent["status"] and events(intent["id"]) == []


@pytest.mark.parametrize(("state", "says"), [("succeeded", "refund it"), ("failed", "nothing to cancel")])
def test_a_settled_intent_cannot_be_canceled(acme, state, says):
    intent_id = acme.intent()["id"]
    sql("UPDATE payment_intents SET status = %s WHERE id = %s", [state, intent_id])
    response = cancel(acme, intent_id)
    assert response.status_code == 409 and says in error_of(response)["message"]


def test_bad_cancels_are_refused(acme, settings):
    intent_id = acme.intent()["id"]
    bad = cancel(acme, intent_id, {"cancellation_reason": "bored"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "cancellation_reason"
    assert cancel(acme, "pi_nope").status_code == 404
    other = RefundingMerchant("Globex")
    assert cancel(other, intent_id).status_code == 404
    assert intent_status(intent_id) == "requires_confirmation"


def test_canceling_expires_the_intents_open_checkout_session_with_its_event(acme):
    session = acme.call("POST", "/v1/checkout/sessions", {"amount": 700, "currency": "usd", "rail": "sandbox_push"})
    session = session.json()
    assert cancel(acme, session["payment_intent"], key="c-1").status_code == 200
    got = acme.call("GET", f"/v1/checkout/sessions/{session['id']}").json()
    assert (got["status"], got["payment_status"]) == ("expired", "unpaid")
    ((_, data),) = events(session["id"], "checkout.session.expired")
    assert data["client_secret"] is None and data["url"] is None
    # A replay of the cancel answers the same and writes nothing more.
    replay = cancel(acme, session["payment_intent"], key="c-1")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    # payment_intent.created, payment_intent.canceled, checkout.session.expired.
    assert scalar("SELECT count(*) FROM events") == 3


def test_a_cancel_racing_a_confirm_leaves_exactly_one_winner(acme):
    for _ in range(3):
        intent_id = acme.intent()["id"]
        lock = RowLock(intent_id)
        confirm, canceled = race(
            lock,
            lambda i=intent_id: acme.call("POST", f"/v1/payment_intents/{i}/confirm"),
            lambda i=intent_id: cancel(acme, i),
        )
        codes = (confirm.status_code, canceled.status_code)
        assert sorted(codes) == [200, 409], (confirm.content, canceled.content)
        if canceled.status_code == 200:
            # The cancel won: nothing was sent, and no charge exists.
            assert intent_status(intent_id) == "canceled" and charge_of(intent_id) is None
        else:
            assert intent_status(intent_id) == "processing" and charge_of(intent_id) is not None
            assert [t for t, _ in events(intent_id)] == []
