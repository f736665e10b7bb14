"""``/v1/refunds`` against the real database (no worker: what the web process accepts,
refuses and writes), and the over-refund race run with real concurrent connections."""

from __future__ import annotations

import pytest

from tests.api_support import error_of
from tests.charges_support import events, scalar
from tests.factories.payments import RefundFactory
from tests.refund_support import RowLock, amount_refunded, race

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refund_defaults_to_what_is_left_and_the_intent_shows_it(acme_api):
    intent_id = acme_api.paid_intent(amount=1000)
    first = acme_api.refund(intent_id, amount=300, reason="requested_by_customer")
    assert first.status_code == 200, first.content
    refund = first.json()
    assert refund["id"].startswith("re_") and refund["object"] == "refund"
    assert (refund["payment_intent"], refund["amount"], refund["currency"]) == (intent_id, 300, "usd")
    assert (refund["status"], refund["failure_code"], refund["reason"]) == ("submitting", None, "requested_by_customer")
    assert isinstance(refund["created"], int)
    rest = acme_api.refund(intent_id).json()  # no amount: all that is left
    assert rest["amount"] == 700
    shown = acme_api.call("GET", f"/v1/payment_intents/{intent_id}").json()
    assert (shown["status"], shown["amount_refunded"]) == ("succeeded", 1000)
    # One poll job per refund, due now, carrying the merchant as its tenant.
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_refund' AND tenant = %s", [acme_api.merchant.id]) == 2
    assert scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [f"refund:poll:{refund['id']}"]) == 1
    # Nothing is sent from the web process: the worker sends it.
    assert scalar("SELECT count(*) FROM provider_requests WHERE refund_id IS NOT NULL") == 0


def test_refunds_are_read_back_and_listed_by_intent_with_pagination(acme_api):
    one, two = acme_api.paid_intent(), acme_api.paid_intent()
    ids = [acme_api.refund(one, amount=100).json()["id"] for _ in range(3)]
    other = acme_api.refund(two, amount=100).json()["id"]
    got = acme_api.call("GET", f"/v1/refunds/{ids[0]}").json()
    assert (got["id"], got["amount"], got["payment_intent"]) == (ids[0], 100, one)
    page = acme_api.call("GET", f"/v1/refunds?payment_intent={one}&limit=2").json()
    assert page["object"] == "list" and page["has_more"] is True
    rest = acme_api.call("GET", f"/v1/refunds?payment_intent={one}&limit=2&starting_after={page['data'][-1]['id']}")
    assert [r["id"] for r in page["data"] + rest.json()["data"]] == ids[::-1]  # newest first, each once
    assert {r["id"] for r in acme_api.call("GET", "/v1/refunds").json()["data"]} == {*ids, other}
    assert acme_api.call("GET", "/v1/refunds?status=x").status_code == 400  # no such filter


def test_an_idempotency_key_replays_the_refund_and_writes_it_once(acme_api):
    intent_id = acme_api.paid_intent()
    first = acme_api.call("POST", "/v1/refunds", {"payment_intent": intent_id, "amount": 400}, key="r-1")
    again = acme_api.call("POST", "/v1/refunds", {"payment_intent": intent_id, "amount": 400}, key="r-1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert scalar("SELECT count(*) FROM refunds") == 1 and amount_refunded(intent_id) == 400
    other = acme_api.call("POST", "/v1/refunds", {"payment_intent": intent_id, "amount": 401}, key="r-1")
    assert other.status_code == 409 and error_of(other)["code"] == "idempotency_key_in_use"


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"amount": 0}, 400, "parameter_out_of_range", "amount"),
        ({"amount": -5}, 400, "parameter_out_of_range", "amount"),
        ({"amount": "5"}, 400, "parameter_invalid_type", "amount"),
        ({"amount": 1001}, 400, "amount_too_large", "amount"),
        ({"reason": "because"}, 400, "parameter_invalid", "reason"),
        ({"metadata": {}}, 400, "parameter_unknown", "metadata"),
    ],
)
def test_bad_refunds_are_refused_and_write_nothing(acme_api, fields, status, code, param):
    intent_id = acme_api.paid_intent(amount=1000)
    response = acme_api.refund(intent_id, **fields)
    assert response.status_code == status, response.content
    assert (error_of(response)["code"], error_of(response)["param"]) == (code, param)
    assert scalar("SELECT count(*) FROM refunds") == 0 and amount_refunded(intent_id) == 0
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_refund'") == 0


@pytest.mark.parametrize(
    ("currency", "amount", "bounds"),
    [
        ("usd", 0, "between $0.01 and $10,000,000,000.00"),
        ("usd", 10**12 + 1, "between $0.01 and $10,000,000,000.00"),  # its bound, before what is left
        ("jpy", 0, "between ¥1 and ¥1,000,000,000,000"),
        ("bhd", -1, "between BHD\u00a00.001 and BHD\u00a01,000,000,000.000"),
    ],
)
def test_a_refund_outside_its_currencys_bounds_is_refused_naming_them(acme_api, settings, currency, amount, bounds):
    settings.VPAY_CURRENCIES = ["usd", "jpy", "bhd"]
    intent_id = acme_api.paid_intent(amount=1000, currency=currency)
    response = acme_api.refund(intent_id, amount=amount)
    assert response.status_code == 400, response.content
    assert (error_of(response)["code"], error_of(response)["param"]) == ("parameter_out_of_range", "amount")
    assert f"amount must be {bounds} (" in error_of(response)["message"]
    assert scalar("SELECT count(*) FROM refunds") == 0 and amount_refunded(intent_id) == 0


def test_more_than_is_left_is_refused_and_a_full_refund_leaves_nothing(acme_api):
    intent_id = acme_api.paid_intent(amount=1000)
    assert acme_api.refund(intent_id, amount=600).status_code == 200
    over = acme_api.refund(intent_id, amount=401)
    assert over.status_code == 400 and error_of(over)["code"] == "amount_too_large"
    assert "($4.00)" in error_of(over)["message"]  # says what is left, in dollars
    assert acme_api.refund(intent_id).json()["amount"] == 400
    done = acme_api.refund(intent_id, amount=1)
    assert done.status_code == 400 and error_of(done)["code"] == "charge_already_refunded"
    assert amount_refunded(intent_id) == 1000


@pytest.mark.parametrize("state", ["requires_confirmation", "processing", "failed", "canceled"])
def test_only_a_succeeded_intent_can_be_refunded(acme_api, state):
    intent_id = acme_api.intent()["id"]
    if state != "requires_confirmation":
        scalar("UPDATE payment_intents SET status = %s WHERE id = %s RETURNING id", [state, intent_id])
    response = acme_api.refund(intent_id)
    assert response.status_code == 409
    assert error_of(response)["code"] == "payment_intent_unexpected_state"
    assert state in error_of(response)["message"]
    assert scalar("SELECT count(*) FROM refunds") == 0


def test_an_unknown_or_another_merchants_intent_or_refund_is_a_404(acme_api):
    their_refund = RefundFactory(amount=10)  # another merchant's, on its paid intent
    theirs = their_refund.intent_id
    for intent_id in (theirs, "pi_doesnotexist"):
        response = acme_api.refund(intent_id)
        assert response.status_code == 404
        assert (error_of(response)["code"], error_of(response)["param"]) == ("resource_missing", "payment_intent")
    assert acme_api.call("GET", f"/v1/refunds/{their_refund.id}").status_code == 404
    assert acme_api.call("GET", f"/v1/refunds?payment_intent={theirs}").json()["data"] == []
    assert scalar("SELECT count(*) FROM refunds") == 1 and amount_refunded(theirs) == 10


def test_the_database_refuses_a_total_refunded_past_what_was_received(acme_api):
    from django.db import IntegrityError, transaction

    intent_id = acme_api.paid_intent(amount=1000)
    with pytest.raises(IntegrityError, match="charges_paymentintent_refunded_within_received"), transaction.atomic():
        scalar("UPDATE payment_intents SET amount_refunded = 1001 WHERE id = %s RETURNING id", [intent_id])


def test_two_racing_refunds_that_together_exceed_the_amount_get_exactly_one_acceptance(acme_api):
    intent_id = acme_api.paid_intent(amount=1000)
    # A third connection holds the intent's row: both requests reach their lock and queue
    # behind it, and are let go together. Without the refund's own row lock each would read
    # 0 refunded before the other committed, and both would be accepted.
    lock = RowLock(intent_id)
    first, second = race(
        lock, lambda: acme_api.refund(intent_id, amount=600), lambda: acme_api.refund(intent_id, amount=600)
    )
    assert sorted([first.status_code, second.status_code]) == [200, 400], (first.content, second.content)
    refused = first if first.status_code == 400 else second
    assert error_of(refused)["code"] == "amount_too_large"
    assert scalar("SELECT count(*), sum(amount) FROM refunds WHERE intent_id = %s", [intent_id]) == 1
    assert amount_refunded(intent_id) == 600


def test_a_failed_refund_gives_its_amount_back(acme_api):
    from charges import refund_repository
    from charges.services.refunds import refund_fail

    refund = RefundFactory(intent__merchant=acme_api.merchant, intent__amount=1000)
    intent_id = refund.intent_id
    row = refund_repository.read_for_poll(refund.id)
    assert refund_fail(row=row, failure_code="declined") is True
    assert refund_fail(row=row, failure_code="declined") is False  # once
    assert amount_refunded(intent_id) == 0
    assert [t for t, _ in events(refund.id)] == ["refund.failed"]
    assert acme_api.refund(intent_id).json()["amount"] == 1000
