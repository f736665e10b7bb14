"""The payer's credentials are sealed at rest: a checkout session's client secret, a
charge's ``pay_token`` and the ``redirect_url`` carrying it are stored sealed for their row
(``VPAY_SECRETS_KEY``), as the idempotency records that repeat them already were, and the
API and the worker still see them in the clear."""

from __future__ import annotations

import re

import pytest

from charges.models import Charge, CheckoutSession
from charges.repository import read_for_poll
from tests.charges_support import FAST_POLICY, Merchant, apply_policy, sql, use_rails
from vpay import sealing

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme(settings, tmp_path, sandbox_rail):
    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_CONFIRM_GRACE_SECONDS": 30.0})
    use_rails(settings, tmp_path, sandbox_rail.rails())
    return Merchant("Acme")


def test_a_redirect_charges_pay_token_and_url_are_sealed_at_rest_and_read_in_the_clear(acme):
    intent = acme.confirm(acme.intent(rail="sandbox_redirect")["id"])
    url = intent["next_action"]["redirect_url"]
    charge_id = intent["charge"]["id"]
    pay_token, redirect_url = sql("SELECT pay_token, redirect_url FROM charges WHERE id = %s", [charge_id])[0]
    token = Charge.objects.get(pk=charge_id).pay_token
    assert token and token in url
    for stored in (pay_token, redirect_url):
        # Nothing but a sealed token: no URL punctuation, no plaintext. ("pay" not in stored
        # matched random ciphertext by chance: about one run in 800.)
        assert sealing.is_sealed(stored.encode()) and token not in stored
        assert re.fullmatch(r"v2\.[A-Za-z0-9_-]+=*", stored), stored[:12]
    assert sealing.open_text(redirect_url, sealing.binding_of(Charge, "redirect_url", charge_id)) == url
    # The worker's raw read opens it too: polling a redirect charge needs the token.
    assert read_for_poll(charge_id).pay_token == token
    assert acme.call("GET", f"/v1/payment_intents/{intent['id']}").json()["next_action"]["redirect_url"] == url


def test_a_checkout_sessions_client_secret_is_sealed_at_rest_and_answered_in_the_clear(acme):
    created = acme.call(
        "POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "sandbox_push"}
    ).json()
    secret = created["client_secret"]
    assert secret.startswith("cs_secret_")
    (stored,) = sql("SELECT client_secret FROM checkout_sessions WHERE id = %s", [created["id"]])[0]
    assert sealing.is_sealed(stored.encode()) and secret not in stored
    assert CheckoutSession.objects.get(pk=created["id"]).client_secret == secret
    assert acme.call("GET", f"/v1/checkout/sessions/{created['id']}").json()["client_secret"] == secret


def test_a_sealed_column_refuses_to_be_searched_by_value():
    # Sealing is randomized: a lookup by value would silently match nothing.
    with pytest.raises(TypeError, match="sealed"):
        list(CheckoutSession.objects.filter(client_secret="cs_secret_x"))
