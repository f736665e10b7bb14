"""The hosted checkout page over Django's test client, against the real database and the
sandbox rail over HTTP (the browser test, with a real worker, is tests/test_checkout_browser.py):
what each state shows, with which status, the pay button's CSRF and confirm, and what the
page never reveals."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.test import Client

from tests.charges_support import charge_of, intent_status, sql

# The confirm commits before it calls the rail: only a real transaction shows that.
pytestmark = pytest.mark.django_db(transaction=True)

SUCCESS = "https://shop.example/thanks?session={CHECKOUT_SESSION_ID}"
CANCEL = "https://shop.example/cart"


def open_session(merchant, **fields) -> dict:
    body = {"amount": 2500, "currency": "eur", "rail": "sandbox_push", **fields}
    response = merchant.call("POST", "/v1/checkout/sessions", body)
    assert response.status_code == 200, response.content
    return response.json()


def page_path(session: dict) -> str:
    return urlsplit(session["url"]).path


def pay(client: Client, session: dict):
    """The pay button, as a browser sends it: the page's form, its CSRF token and cookie."""
    page = client.get(page_path(session))
    token = page.context["csrf_token"]
    return client.post(page_path(session) + "/pay", {"csrfmiddlewaretoken": str(token)})


def test_an_open_session_shows_the_merchant_the_amount_and_a_pay_button_and_nothing_secret(acme_api):
    session = open_session(acme_api, success_url=SUCCESS, cancel_url=CANCEL)
    response = Client().get(page_path(session))
    html = response.content.decode()
    assert response.status_code == 200 and 'data-page="pay"' in html
    assert "Acme" in html and "€25.00" in html and 'id="pay"' in html
    assert "csrfmiddlewaretoken" in html and f'href="{CANCEL}"' in html
    assert session["client_secret"] not in html and "sk_" not in html
    assert response["Cache-Control"] == "no-store" and response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("currency", "amount", "shown"),
    [("usd", 1999, "$19.99"), ("xof", 2500, "F\N{NARROW NO-BREAK SPACE}CFA\N{NO-BREAK SPACE}2,500")],
)
def test_the_amount_reads_in_the_currencys_own_units(acme_api, currency, amount, shown):
    session = open_session(acme_api, currency=currency, amount=amount)
    html = Client().get(page_path(session)).content.decode()
    assert f'id="amount">{shown}<' in html


def test_an_unknown_session_is_a_clear_404_page():
    response = Client().get("/checkout/cs_nothing_here")
    assert response.status_code == 404 and "Checkout not found" in response.content.decode()
    assert Client(enforce_csrf_checks=True).post("/checkout/cs_nothing_here/pay").status_code == 403  # CSRF first
    assert Client().post("/checkout/cs_nothing_here/pay")["Location"] == "/checkout/cs_nothing_here"


def test_the_pay_button_refuses_a_post_without_its_csrf_token(acme_api):
    session = open_session(acme_api)
    response = Client(enforce_csrf_checks=True).post(page_path(session) + "/pay")
    assert response.status_code == 403
    assert intent_status(session["payment_intent"]) == "requires_confirmation"


def test_paying_on_a_push_rail_confirms_the_intent_and_follows_it_until_it_settles(acme_api):
    session = open_session(acme_api, success_url=SUCCESS)
    client = Client(enforce_csrf_checks=True)
    response = pay(client, session)
    assert response.status_code == 303 and response["Location"] == page_path(session)
    assert intent_status(session["payment_intent"]) == "processing"
    assert charge_of(session["payment_intent"])["status"] == "submitted"
    following = client.get(page_path(session))
    html = following.content.decode()
    assert following.status_code == 200 and 'data-page="following"' in html
    assert 'http-equiv="refresh"' in html
    # A second press (another tab, a double click) confirms nothing twice: back to the page.
    assert pay(client, session).status_code == 303
    assert sql("SELECT count(*) FROM charges WHERE intent_id = %s", [session["payment_intent"]])[0][0] == 1
    # Settled (as the worker's settlement writes it): on to the merchant's page, the id in it.
    sql("UPDATE payment_intents SET status = 'succeeded' WHERE id = %s", [session["payment_intent"]])
    sql("UPDATE checkout_sessions SET status = 'complete', payment_status = 'paid' WHERE id = %s", [session["id"]])
    done = client.get(page_path(session))
    assert done.status_code == 303
    assert done["Location"] == f"https://shop.example/thanks?session={session['id']}"


def test_a_paid_session_without_a_success_url_says_it_is_paid(acme_api):
    session = open_session(acme_api)
    sql("UPDATE payment_intents SET status = 'succeeded' WHERE id = %s", [session["payment_intent"]])
    response = Client().get(page_path(session))
    assert response.status_code == 200 and "Payment complete" in response.content.decode()


def test_paying_on_a_redirect_rail_sends_the_browser_to_the_rails_page_once(acme_api, rails):
    session = open_session(acme_api, rail="sandbox_redirect")
    client = Client()
    onward = pay(client, session)
    assert onward.status_code == 303 and onward["Location"].startswith(rails.url + "/redirect/pay/")
    assert onward["Referrer-Policy"] == "same-origin"  # the session's address stays here
    assert intent_status(session["payment_intent"]) == "requires_action"
    # Back from the rail before the worker heard its answer: followed, not bounced to the rail
    # again, with the way on to the rail for a payer who has not approved yet.
    back = client.get(page_path(session))
    html = back.content.decode()
    assert back.status_code == 200 and 'data-page="following"' in html
    assert f'id="rail-link" href="{onward["Location"]}"'.replace("&", "&amp;") in html


def test_a_failed_payment_says_so_and_offers_no_second_try(acme_api):
    session = open_session(acme_api, cancel_url=CANCEL)
    sql("UPDATE payment_intents SET status = 'failed' WHERE id = %s", [session["payment_intent"]])
    response = Client().get(page_path(session))
    html = response.content.decode()
    assert response.status_code == 200 and "The payment failed" in html
    assert 'id="pay"' not in html and f'href="{CANCEL}"' in html


@pytest.mark.parametrize(
    "expire",
    [
        "UPDATE checkout_sessions SET status = 'expired', expired_at = now() WHERE id = %s",
        # Past its expiry on the database's clock, before the hourly sweep reached it.
        "UPDATE checkout_sessions SET expires_at = now() - interval '1 second' WHERE id = %s",
    ],
)
def test_an_expired_session_is_gone_and_cannot_be_paid(acme_api, expire):
    session = open_session(acme_api)
    sql(expire, [session["id"]])
    client = Client()
    response = client.get(page_path(session))
    assert response.status_code == 410 and "This checkout has expired" in response.content.decode()
    refused = client.post(page_path(session) + "/pay")
    assert refused.status_code == 303 and refused["Location"] == page_path(session)
    assert intent_status(session["payment_intent"]) == "requires_confirmation"


def test_a_canceled_intents_session_is_gone(acme_api):
    session = open_session(acme_api)
    assert acme_api.call("POST", f"/v1/payment_intents/{session['payment_intent']}/cancel", {}).status_code == 200
    assert Client().get(page_path(session)).status_code == 410
