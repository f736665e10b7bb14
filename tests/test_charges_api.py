"""The payment API against the real database and the sandbox rail over HTTP (no worker
here: what the web process writes, and what it refuses to write)."""

from __future__ import annotations

import json

import pytest

from tests.api_support import error_of, refusal_of
from tests.charges_support import charge_of, events, intent_status, poll_job, scalar, sql, use_rails

# Confirm commits before it calls the rail: only a real transaction shows that.
pytestmark = pytest.mark.django_db(transaction=True)


def counts() -> tuple[int, int, int, int]:
    return tuple(
        scalar(f"SELECT count(*) FROM {t}")
        for t in ("payment_intents", "charges", "provider_requests", "checkout_sessions")
    )


# --- create / retrieve / list ---------------------------------------------------------


def test_create_an_intent_and_read_it_back(acme_api):
    created = acme_api.intent(amount=1999, metadata={"order": "42"})
    assert created["object"] == "payment_intent" and created["id"].startswith("pi_")
    assert (created["status"], created["amount"], created["currency"], created["rail"]) == (
        "requires_confirmation",
        1999,
        "usd",
        "sandbox_push",
    )
    assert created["charge"] is None and created["metadata"] == {"order": "42"}
    assert acme_api.call("GET", f"/v1/payment_intents/{created['id']}").json() == created


def test_list_intents_newest_first_and_only_the_merchants_own(acme_api, globex_api):
    mine = [acme_api.intent(amount=100 + i)["id"] for i in range(3)]
    theirs = globex_api.intent()["id"]
    listed = acme_api.call("GET", "/v1/payment_intents?limit=2").json()
    assert [i["id"] for i in listed["data"]] == mine[::-1][:2] and listed["has_more"] is True
    page2 = acme_api.call("GET", f"/v1/payment_intents?limit=2&starting_after={mine[1]}").json()
    assert [i["id"] for i in page2["data"]] == [mine[0]]
    assert error_of(acme_api.call("GET", f"/v1/payment_intents/{theirs}"))["code"] == "resource_missing"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"amount": 100, "currency": "usd", "rail": "nope"}, "rail_unknown", "rail"),
        ({"amount": 0, "currency": "usd", "rail": "sandbox_push"}, "parameter_out_of_range", "amount"),
        ({"amount": -5, "currency": "usd", "rail": "sandbox_push"}, "parameter_out_of_range", "amount"),
        ({"amount": 1.5, "currency": "usd", "rail": "sandbox_push"}, "parameter_invalid_type", "amount"),
        ({"amount": 2500.0, "currency": "xof", "rail": "sandbox_push"}, "parameter_invalid_type", "amount"),
        ({"amount": True, "currency": "usd", "rail": "sandbox_push"}, "parameter_invalid_type", "amount"),
        ({"amount": 100, "currency": "xyz", "rail": "sandbox_push"}, "currency_unsupported", "currency"),
        ({"amount": 100, "currency": "USD", "rail": "sandbox_push"}, "currency_unsupported", "currency"),
        ({"amount": 100, "currency": "usd"}, "parameter_missing", "rail"),
        ({"amount": 100, "currency": "usd", "rail": "sandbox_push", "colour": "red"}, "parameter_unknown", "colour"),
        (
            {"amount": 100, "currency": "usd", "rail": "sandbox_push", "customer": "cus_nobody"},
            "resource_missing",
            "customer",
        ),
    ],
)
def test_bad_input_is_a_4xx_in_the_common_format_and_writes_nothing(acme_api, body, code, param):
    before = counts()
    response = acme_api.call("POST", "/v1/payment_intents", body)
    assert response.status_code == 400
    assert (error_of(response)["code"], error_of(response)["param"]) == (code, param)
    assert counts() == before


# The currencies of tests/test_money.py's table by exponent: 2, 0 and 3 decimals.
BOUNDS = {
    "usd": "between $0.01 and $10,000,000,000.00 (1 to 1000000000000 in minor units; USD has 2 decimals)",
    "jpy": "between ¥1 and ¥1,000,000,000,000 (1 to 1000000000000 in minor units; JPY has 0 decimals)",
    "xof": (
        "between F\u202fCFA\u00a01 and F\u202fCFA\u00a01,000,000,000,000"
        " (1 to 1000000000000 in minor units; XOF has 0 decimals)"
    ),
    "bhd": (
        "between BHD\u00a00.001 and BHD\u00a01,000,000,000.000 (1 to 1000000000000 in minor units; BHD has 3 decimals)"
    ),
}


@pytest.mark.parametrize("path", ["/v1/payment_intents", "/v1/checkout/sessions"])
@pytest.mark.parametrize("currency", sorted(BOUNDS))
def test_an_amount_outside_its_currencys_bounds_is_a_400_naming_them_and_the_bounds_are_accepted(
    acme_api, settings, path, currency
):
    settings.VPAY_CURRENCIES = sorted(BOUNDS)
    for amount in (0, -1, 10**12 + 1, 10**30):
        before = counts()
        response = acme_api.call("POST", path, {"amount": amount, "currency": currency, "rail": "sandbox_push"})
        assert response.status_code == 400, response.content
        assert refusal_of(response) == {
            "type": "invalid_request_error",
            "code": "parameter_out_of_range",
            "param": "amount",
            "message": f"amount must be {BOUNDS[currency]}.",
        }
        assert counts() == before
    for amount in (1, 10**12):
        response = acme_api.call("POST", path, {"amount": amount, "currency": currency, "rail": "sandbox_push"})
        assert response.status_code == 200, response.content
        assert (response.json()["amount"], response.json()["currency"]) == (amount, currency)


def test_a_currency_vpay_does_not_accept_is_refused_whatever_the_amount(acme_api, settings):
    settings.VPAY_CURRENCIES = ["usd"]
    response = acme_api.call(
        "POST", "/v1/payment_intents", {"amount": 10**30, "currency": "jpy", "rail": "sandbox_push"}
    )
    assert response.status_code == 400
    assert (error_of(response)["code"], error_of(response)["message"]) == (
        "currency_unsupported",
        "Unsupported currency 'jpy'; use one of: usd (lower case).",
    )


def test_another_merchants_customer_is_refused(acme_api, globex_api):
    cus = globex_api.call("POST", "/v1/customers", {"email": "a@b.example"}).json()["id"]
    response = acme_api.call(
        "POST", "/v1/payment_intents", {"amount": 1, "currency": "usd", "rail": "sandbox_push", "customer": cus}
    )
    assert error_of(response)["code"] == "resource_missing"


def test_create_and_confirm_move_the_customers_last_used_at_on_the_database_clock(acme_api):
    cus = acme_api.call("POST", "/v1/customers", {"email": "c@d.example"}).json()["id"]
    sql("UPDATE customers SET last_used_at = now() - interval '30 days' WHERE id = %s", [cus])
    intent = acme_api.intent(customer=cus)
    assert intent["customer"] == cus
    assert scalar("SELECT now() - last_used_at < interval '1 minute' FROM customers WHERE id = %s", [cus])
    sql("UPDATE customers SET last_used_at = now() - interval '30 days' WHERE id = %s", [cus])
    acme_api.confirm(intent["id"])
    assert scalar("SELECT now() - last_used_at < interval '1 minute' FROM customers WHERE id = %s", [cus])


# --- confirm ----------------------------------------------------------------------------


def test_confirm_on_a_push_rail_submits_and_pulls_the_poll_forward(acme_api, rails):
    intent = acme_api.confirm(acme_api.intent()["id"])
    charge = intent["charge"]
    assert intent["status"] == "processing" and charge["status"] == "submitted"
    assert intent["redirect_url"] is None and intent["next_action"] is None
    # The poll job was written 30 s out (the grace) and pulled forward to now by the CAS.
    job = poll_job(charge["id"])
    assert job is not None and job["due_in"] <= 0
    # The request row: written before, answered after.
    assert sql(
        "SELECT operation, method, path, idempotency_key, status_code, rail_status FROM provider_requests WHERE charge_id = %s",
        [charge["id"]],
    ) == [("submit", "POST", "/charges", charge["id"], 200, "pending")]
    sent = [r for r in rails.requests(charge["id"]) if r["method"] == "POST"]
    assert len(sent) == 1 and sent[0]["idempotency_key"] == charge["id"]
    assert sent[0]["body"] == {"reference": charge["id"], "amount": 1000, "currency": "usd"}


def test_confirm_on_a_redirect_rail_hands_out_the_url(acme_api):
    intent = acme_api.confirm(acme_api.intent(rail="sandbox_redirect")["id"])
    url = intent["redirect_url"]
    assert intent["status"] == "requires_action" and url and "pay_token=" in url
    assert intent["next_action"] == {"type": "redirect_to_url", "redirect_url": url}
    stored = charge_of(intent["id"])
    assert stored["status"] == "submitted" and stored["pay_token"] and stored["redirect_url"] == url
    # The excerpt of the answer is stored redacted: the pay_token is the payer's.
    excerpt = scalar("SELECT response_excerpt FROM provider_requests WHERE charge_id = %s", [stored["id"]])
    assert stored["pay_token"] not in excerpt


def test_confirming_twice_is_a_409_and_writes_nothing(acme_api):
    intent_id = acme_api.intent()["id"]
    acme_api.confirm(intent_id)
    before = counts()
    response = acme_api.call("POST", f"/v1/payment_intents/{intent_id}/confirm")
    assert response.status_code == 409 and error_of(response)["code"] == "payment_intent_unexpected_state"
    assert counts() == before


@pytest.mark.parametrize("terminal", ["succeeded", "failed"])
def test_confirming_a_terminal_intent_is_a_409_and_writes_nothing(acme_api, terminal):
    intent_id = acme_api.intent()["id"]
    sql("UPDATE payment_intents SET status = %s WHERE id = %s", [terminal, intent_id])
    before = counts()
    response = acme_api.call("POST", f"/v1/payment_intents/{intent_id}/confirm")
    assert response.status_code == 409 and terminal in error_of(response)["message"]
    assert counts() == before


def test_confirm_with_a_body_or_of_an_unknown_intent_is_refused(acme_api):
    intent_id = acme_api.intent()["id"]
    assert acme_api.call("POST", f"/v1/payment_intents/{intent_id}/confirm", {"x": 1}).status_code == 400
    assert acme_api.call("POST", "/v1/payment_intents/pi_nobody/confirm").status_code == 404
    assert intent_status(intent_id) == "requires_confirmation" and charge_of(intent_id) is None


def test_a_lost_submit_answer_leaves_a_submitting_charge_with_an_unanswered_request(acme_api, rails):
    rails.scenario(amount=3001, drop_submits=1)
    intent = acme_api.confirm(acme_api.intent(amount=3001)["id"])
    assert intent["status"] == "processing" and intent["charge"]["status"] == "submitting"
    charge_id = intent["charge"]["id"]
    code, error = sql("SELECT status_code, error FROM provider_requests WHERE charge_id = %s", [charge_id])[0]
    assert code is None and "RemoteProtocolError" in error  # sent; no answer; the cause kept
    # The poll job keeps its grace (30 s here): nothing pulled it forward.
    assert poll_job(charge_id)["due_in"] > 20


def test_a_submit_the_rail_refuses_for_good_fails_the_intent_with_an_event(acme_api, rails):
    rails.scenario(amount=3002, submit_status=422)
    intent = acme_api.confirm(acme_api.intent(amount=3002)["id"])
    assert intent["status"] == "failed" and intent["charge"]["failure_code"] == "rail_rejected"
    assert [t for t, _ in events(intent["id"])] == ["payment_intent.payment_failed"]


@pytest.mark.parametrize(
    "scenario",
    [
        {"submit_body": ""},
        {"submit_body": "<html>bad gateway</html>"},
        {"submit_body": '{"status": "authorised"}'},
        {"submit_status": 409, "submit_records": True},
        {"submit_status": 429, "retry_after": "5"},
        {"submit_status": 408},
    ],
)
def test_a_submit_answer_that_is_no_refusal_leaves_the_charge_live_and_polled(acme_api, rails, scenario):
    # The rail may hold the charge and the payer may approve it: telling the merchant
    # "failed" here is how money moves on a charge we reported dead.
    rails.scenario(amount=3003, **scenario)
    intent = acme_api.confirm(acme_api.intent(amount=3003)["id"])
    assert intent["status"] == "processing" and intent["charge"]["status"] == "submitting"
    assert events(intent["id"]) == []
    assert poll_job(intent["charge"]["id"]) is not None


def test_an_idempotent_confirm_replays_its_answer_and_calls_the_rail_once(acme_api, rails):
    intent_id = acme_api.intent()["id"]
    first = acme_api.call("POST", f"/v1/payment_intents/{intent_id}/confirm", key="confirm-1")
    again = acme_api.call("POST", f"/v1/payment_intents/{intent_id}/confirm", key="confirm-1")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    charge_id = first.json()["charge"]["id"]
    assert len([r for r in rails.requests(charge_id) if r["method"] == "POST"]) == 1


# --- checkout sessions -------------------------------------------------------------------


def test_a_checkout_session_is_open_for_24_hours_with_a_url_and_a_client_secret(acme_api, globex_api):
    response = acme_api.call(
        "POST",
        "/v1/checkout/sessions",
        {"amount": 500, "currency": "usd", "rail": "sandbox_push", "success_url": "https://shop.example/ok"},
    )
    assert response.status_code == 200, response.content
    session = response.json()
    assert session["object"] == "checkout.session" and session["id"].startswith("cs_")
    assert (session["status"], session["payment_status"]) == ("open", "unpaid")
    assert session["url"].endswith(session["id"]) and session["client_secret"].startswith("cs_secret_")
    assert session["expires_at"] - session["created"] == 24 * 3600
    assert intent_status(session["payment_intent"]) == "requires_confirmation"
    assert acme_api.call("GET", f"/v1/checkout/sessions/{session['id']}").json() == session
    assert globex_api.call("GET", f"/v1/checkout/sessions/{session['id']}").status_code == 404


def test_a_bad_checkout_session_writes_nothing(acme_api):
    before = counts()
    response = acme_api.call("POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "nope"})
    assert error_of(response)["code"] == "rail_unknown"
    assert counts() == before


SESSION = {"amount": 500, "currency": "usd", "rail": "sandbox_push"}


@pytest.mark.parametrize("param", ["success_url", "cancel_url"])
@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(document.cookie)",
        "JavaScript:alert(1)",
        " javascript:alert(1)",
        "java\tscript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "vbscript:msgbox(1)",
        "ftp://shop.example/ok",
        "//evil.example/ok",
        "/relative/ok",
        "https:///no-host",
        "https:\\\\evil.example/ok",
        "https://shop.example@evil.example/ok",
        "https://user:pw@shop.example/ok",
        "https://shop.example/ok\nSet-Cookie: x=1",
        "https://shop.example:99999/ok",
        "",
    ],
)
def test_a_checkout_session_refuses_a_return_url_that_is_not_http_and_writes_nothing(acme_api, param, url):
    before = counts()
    response = acme_api.call("POST", "/v1/checkout/sessions", {**SESSION, param: url})
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert (error["code"], error["param"]) == ("parameter_invalid", param)
    assert "pw" not in error["message"]
    assert counts() == before


def test_a_checkout_session_return_url_must_be_https_in_live_mode(acme_api, settings):
    plain = {**SESSION, "success_url": "http://shop.example/ok", "cancel_url": "http://shop.example/no"}
    assert acme_api.call("POST", "/v1/checkout/sessions", plain).status_code == 200
    acme_api.go_live(settings)
    before = counts()
    for param in ("success_url", "cancel_url"):
        response = acme_api.call("POST", "/v1/checkout/sessions", {**SESSION, param: "http://shop.example/ok"})
        assert response.status_code == 400 and error_of(response)["param"] == param
        assert "https" in error_of(response)["message"]
    assert counts() == before
    secure = {**SESSION, "success_url": "https://shop.example/ok?o=1", "cancel_url": "HTTPS://shop.example/no"}
    created = acme_api.call("POST", "/v1/checkout/sessions", secure).json()
    assert (created["success_url"], created["cancel_url"]) == ("https://shop.example/ok?o=1", "HTTPS://shop.example/no")


# --- rail callbacks ----------------------------------------------------------------------


def test_a_callback_pulls_a_far_poll_forward_and_believes_nothing_else(acme_api, rails):
    rails.scenario(amount=3003, drop_submits=1)  # leaves the charge submitting, its poll 30 s out
    charge_id = acme_api.confirm(acme_api.intent(amount=3003)["id"])["charge"]["id"]
    response = acme_api.client.post(
        "/rails/sandbox_push/callback",
        {"reference": charge_id, "status": "succeeded"},
        content_type="application/json",
    )
    assert response.status_code == 200 and response.json() == {"received": True}
    assert poll_job(charge_id)["due_in"] <= 0
    assert charge_of(scalar("SELECT intent_id FROM charges WHERE id = %s", [charge_id]))["status"] == "submitting"


def test_a_callback_leaves_a_near_poll_alone(acme_api, rails, settings):
    rails.scenario(amount=3004, drop_submits=1)
    settings.VPAY_CHARGE_CONFIRM_GRACE_SECONDS = 5.0  # under the 10 s floor
    charge_id = acme_api.confirm(acme_api.intent(amount=3004)["id"])["charge"]["id"]
    acme_api.client.post("/rails/sandbox_push/callback", {"reference": charge_id}, content_type="application/json")
    assert poll_job(charge_id)["due_in"] > 3


def test_a_callback_for_an_unknown_reference_is_a_quiet_200_and_an_unknown_rail_a_404(acme_api):
    for body in ({"reference": "ch_nobody"}, {"nothing": True}, ["a list"]):
        response = acme_api.client.post("/rails/sandbox_push/callback", body, content_type="application/json")
        assert response.status_code == 200 and response.json() == {"received": True}
    not_json = acme_api.client.post("/rails/sandbox_push/callback", "not json", content_type="application/json")
    assert not_json.status_code == 400 and error_of(not_json)["code"] == "invalid_json"
    assert acme_api.client.post("/rails/nope/callback", {}, content_type="application/json").status_code == 404
    assert acme_api.client.get("/rails/sandbox_push/callback").status_code == 405


def test_a_callback_naming_another_rails_charge_moves_nothing(acme_api, rails):
    rails.scenario(amount=3005, drop_submits=1)
    charge_id = acme_api.confirm(acme_api.intent(amount=3005)["id"])["charge"]["id"]
    acme_api.client.post("/rails/sandbox_redirect/callback", {"reference": charge_id}, content_type="application/json")
    assert poll_job(charge_id)["due_in"] > 20


def test_a_rail_refusing_our_credentials_on_submit_fails_the_charge_and_pages(acme_api, settings, tmp_path, rails):
    config = rails.rails()
    config["sandbox_push"]["api_key"] = "wrong-key"
    use_rails(settings, tmp_path, config)
    intent = acme_api.confirm(acme_api.intent()["id"])
    assert intent["status"] == "failed" and intent["charge"]["failure_code"] == "rail_configuration_error"
    key, severity = sql("SELECT key, severity FROM alerts WHERE source = 'charges.rail_configuration'")[0]
    assert key == f"rail_credentials_refused:{intent['charge']['id']}" and severity == "page"
    assert [t for t, _ in events(intent["id"])] == ["payment_intent.payment_failed"]


@pytest.mark.parametrize(
    "key",
    ["sk_live_Ab3xY-9qZ_w-7kLmNoPqRs", "momo-Key-9f8e7d6c5b4a3210"],
    ids=["shaped like our keys, with dashes", "an opaque rail key"],
)
def test_a_rail_echoing_our_key_in_its_401_leaves_no_part_of_it_in_the_request_log(
    acme_api, settings, tmp_path, rails, caplog, key
):
    config = rails.rails()
    config["sandbox_push"]["api_key"] = key  # the rail knows another key: it answers 401
    use_rails(settings, tmp_path, config)
    rails.scenario(amount=2601, echo_credentials=True)
    with caplog.at_level("DEBUG"):
        intent = acme_api.confirm(acme_api.intent(amount=2601)["id"])
    assert intent["charge"]["failure_code"] == "rail_configuration_error"
    (excerpt,) = [r[0] for r in sql("SELECT response_excerpt FROM provider_requests")]
    assert "no account has the key [REDACTED]" in excerpt  # the echo arrived, and went
    stored = " ".join(
        r[0]
        for table in ("provider_requests", "charges", "alerts", "payment_intents")
        for r in sql(f"SELECT row_to_json(t)::text FROM {table} t")
    )
    for piece in [key, *key.split("-")]:
        if len(piece) >= 4:
            assert piece not in stored and piece not in caplog.text, piece


def test_an_expired_checkout_sessions_intent_cannot_be_confirmed(acme_api):
    session = acme_api.call(
        "POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "sandbox_push"}
    ).json()
    sql("UPDATE checkout_sessions SET status = 'expired', expired_at = now() WHERE id = %s", [session["id"]])
    before = counts()
    response = acme_api.call("POST", f"/v1/payment_intents/{session['payment_intent']}/confirm")
    assert response.status_code == 409 and error_of(response)["code"] == "checkout_session_expired"
    assert counts() == before and intent_status(session["payment_intent"]) == "requires_confirmation"


def test_a_session_past_its_expires_at_that_the_sweep_has_not_reached_cannot_be_confirmed(acme_api):
    session = acme_api.call(
        "POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "sandbox_push"}
    ).json()
    # Still open (the hourly sweep has not run), but past its time on the database's clock.
    sql("UPDATE checkout_sessions SET expires_at = now() - interval '1 second' WHERE id = %s", [session["id"]])
    before = counts()
    response = acme_api.call("POST", f"/v1/payment_intents/{session['payment_intent']}/confirm")
    assert response.status_code == 409 and error_of(response)["code"] == "checkout_session_expired"
    assert counts() == before and intent_status(session["payment_intent"]) == "requires_confirmation"
    # A session inside its time confirms as usual (the guard is the time, not the session).
    sql("UPDATE checkout_sessions SET expires_at = now() + interval '1 minute' WHERE id = %s", [session["id"]])
    assert acme_api.confirm(session["payment_intent"])["status"] == "processing"


def test_callback_refusals_answer_in_the_common_error_format(acme_api):
    unknown = acme_api.client.post("/rails/nope/callback", {}, content_type="application/json")
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "rail_unknown"
    big = acme_api.client.post(
        "/rails/sandbox_push/callback", {"reference": "x" * (17 * 1024)}, content_type="application/json"
    )
    assert big.status_code == 413 and error_of(big)["code"] == "body_too_large"


def test_no_payable_url_or_pay_token_reaches_the_request_log_whatever_the_url_looks_like(acme_api, rails):
    # This rail carries the token as a path segment: nothing in the URL says "token".
    rails.scenario(amount=3006, url_style="path")
    intent = acme_api.confirm(acme_api.intent(amount=3006, rail="sandbox_redirect")["id"])
    stored = charge_of(intent["id"])
    url, token = intent["redirect_url"], stored["pay_token"]
    assert url.endswith("/" + token) and "pay_token=" not in url  # handed out, as the rail wrote it
    # A poll's answer carries the same two fields.
    from charges.rails import get_rail
    from charges.services import rail_calls

    assert rail_calls.status(stored["id"], get_rail("sandbox_redirect"), pay_token=token).status == "succeeded"
    excerpts = [
        r[0] for r in sql("SELECT response_excerpt FROM provider_requests WHERE charge_id = %s", [stored["id"]])
    ]
    assert len(excerpts) == 2
    for excerpt in excerpts:
        assert token not in excerpt and "/pay/" not in excerpt and "://" not in excerpt
        recorded = json.loads(excerpt)  # the parsed answer, two fields replaced by name
        assert recorded["pay_token"] == recorded["redirect_url"] == "[REDACTED]"
        assert recorded["reference"] == stored["id"] and recorded["status"] in ("pending", "succeeded")


def test_list_filters_by_status_and_refuses_an_unknown_one(acme_api):
    confirmed = acme_api.confirm(acme_api.intent()["id"])["id"]
    acme_api.intent()
    listed = acme_api.call("GET", "/v1/payment_intents?status=processing").json()
    assert [i["id"] for i in listed["data"]] == [confirmed]
    response = acme_api.call("GET", "/v1/payment_intents?status=bogus")
    assert response.status_code == 400 and error_of(response)["param"] == "status"
