"""Input that once answered 500 (issue 23 item 11): each is now a 4xx in its route's error
format, and logs no traceback. The real URLconf and database, Django's test client.

The generated variants of the same inputs, on the routes Schemathesis does not cover (the
rail callback, the token endpoint), are in ``tests/test_input_fuzz.py``.
"""

from __future__ import annotations

import json
import logging
import threading

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client

from charges.rails import forget_configured_rails
from merchants.models import ApiKey
from merchants.services import merchant_create
from tests.charges_support import Merchant, scalar, use_rails
from tests.conftest import database_url, wait_for

pytestmark = pytest.mark.django_db

RAILS = {"momo": {"base_url": "https://rail.example", "flow": "push", "api_key": "k" * 20}}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) - {"request_id"} == {"type", "code", "message", "param"}, body
    return body["error"]


def no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


@pytest.fixture
def rails(settings, tmp_path):
    use_rails(settings, tmp_path, RAILS)
    yield
    forget_configured_rails()  # the next test reads its own rails file


def test_more_query_parameters_than_django_parses_is_a_400_on_an_authenticated_get(client, caplog):
    _, key = merchant_create(name="Acme")
    query = "&".join(f"p{i}=1" for i in range(1001))
    with caplog.at_level(logging.INFO):
        response = client.get(f"/v1/customers?{query}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 400 and error_of(response)["code"] == "too_many_parameters"
    no_traceback(caplog)


def test_more_form_fields_than_django_parses_is_an_invalid_request_on_the_token_endpoint(client, caplog):
    form = "&".join(f"f{i}=1" for i in range(1001))
    with caplog.at_level(logging.INFO):
        response = client.post("/v1/oauth/token", form, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"
    no_traceback(caplog)


@pytest.mark.parametrize("reference", ["ch_\x00", "ch_\ud800"], ids=["NUL", "lone surrogate"])
def test_a_callback_reference_the_database_cannot_hold_is_a_400(client, rails, caplog, reference):
    body = json.dumps({"reference": reference})  # ensure_ascii: the escapes a rail would send
    with caplog.at_level(logging.INFO):
        response = client.post("/rails/momo/callback", body, content_type="application/json")
    assert response.status_code == 400 and error_of(response)["param"] == "reference"
    no_traceback(caplog)


def test_deeply_nested_json_on_the_callback_is_a_400(client, rails, caplog):
    body = "[" * 8000 + "]" * 8000  # inside the 16 KiB cap
    with caplog.at_level(logging.INFO):
        response = client.post("/rails/momo/callback", body, content_type="application/json")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    no_traceback(caplog)


def test_a_callback_body_over_the_cap_is_refused_before_it_is_read(client, rails, caplog):
    # Over Django's DATA_UPLOAD_MAX_MEMORY_SIZE too: reading it whole would have been refused
    # as a SuspiciousOperation (an HTML 400 and a logged traceback) after buffering it.
    body = json.dumps({"reference": "ch_x", "pad": "x" * (3 * 1024 * 1024)})
    with caplog.at_level(logging.INFO):
        response = client.post("/rails/momo/callback", body, content_type="application/json")
    assert response.status_code == 413 and error_of(response)["code"] == "body_too_large"
    no_traceback(caplog)


@pytest.mark.parametrize(
    "overlap", ["²", "٣", "9" * 5000, "-1", " 60"], ids=["superscript", "arabic", "huge", "neg", "space"]
)
def test_a_key_roll_overlap_that_is_not_ascii_digits_is_refused_by_the_form(overlap, caplog):
    user = User.objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    admin = Client(raise_request_exception=False)
    admin.force_login(user)
    merchant, _ = merchant_create(name="Acme")
    post = {"action": "roll_secret_key", "_selected_action": [merchant.id], "post": "yes", "reason": "rotation"}
    with caplog.at_level(logging.INFO):
        response = admin.post("/admin/merchants/merchant/", {**post, "overlap": overlap})
    assert response.status_code == 400 and b"whole number of seconds" in response.content
    assert ApiKey.objects.count() == 1
    no_traceback(caplog)


@pytest.mark.django_db(transaction=True)
def test_a_customer_deleted_while_an_intent_is_created_for_it_is_a_400(rails, caplog):
    acme = Merchant("Acme")
    acme.client = Client(raise_request_exception=False)
    customer = acme.call("POST", "/v1/customers", {"name": "Pat"}).json()["id"]
    # Another connection deletes the customer and holds its transaction open: the request
    # reads the customer as present (committed), then meets the delete's row lock.
    deleter = psycopg.connect(database_url(), autocommit=False)
    deleter.execute("DELETE FROM customers WHERE id = %s", [customer])
    answer: dict = {}

    def create() -> None:
        from django.db import connection

        try:
            answer["response"] = acme.call(
                "POST", "/v1/payment_intents", {"amount": 100, "currency": "usd", "rail": "momo", "customer": customer}
            )
        finally:
            connection.close()

    with caplog.at_level(logging.INFO):
        thread = threading.Thread(target=create)
        thread.start()
        try:
            wait_for(
                lambda: scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                ),
                10,
                message="the request waiting on the delete's lock",
            )
        finally:
            deleter.commit()
            deleter.close()
            thread.join(timeout=20)
    response = answer["response"]
    assert response.status_code == 400, response.content
    assert error_of(response) == {
        "request_id": response["Request-Id"],
        "type": "invalid_request_error",
        "code": "resource_missing",
        "message": f"No such customer: {customer!r}.",
        "param": "customer",
    }
    assert scalar("SELECT count(*) FROM payment_intents") == 0
    no_traceback(caplog)


@pytest.mark.parametrize("depth", [400, 600, 900])
def test_a_deeply_nested_body_field_on_v1_is_a_400(client, caplog, depth):
    _, key = merchant_create(name="Acme")
    body = '{"name": "x", "metadata": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    with caplog.at_level(logging.INFO):
        response = client.post(
            "/v1/customers", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
        )
    assert response.status_code == 400, response.content
    no_traceback(caplog)


def test_a_deeply_nested_callback_reference_is_a_quiet_200(client, rails, caplog):
    body = '{"reference": ' * 700 + "1" + "}" * 700  # parses; only a string names a charge
    with caplog.at_level(logging.INFO):
        response = client.post("/rails/momo/callback", body, content_type="application/json")
    assert response.status_code == 200, response.content
    no_traceback(caplog)


@pytest.mark.django_db(transaction=True)
def test_a_customer_deleted_while_an_intent_for_it_commits_is_deleted_and_the_intent_kept(caplog):
    """The other order of the race above: the delete comes second and wins cleanly, because
    the foreign key is ON DELETE SET NULL in the database (charges migration 0002)."""
    acme = Merchant("Acme")
    acme.client = Client(raise_request_exception=False)
    customer = acme.call("POST", "/v1/customers", {"name": "Pat"}).json()["id"]
    # An intent being created for the customer, as create_intent writes it: the customer
    # touched (its row locked), the intent inserted, not yet committed.
    creator = psycopg.connect(database_url(), autocommit=False)
    creator.execute("UPDATE customers SET last_used_at = now() WHERE id = %s", [customer])
    creator.execute(
        "INSERT INTO payment_intents (id, merchant_id, customer_id, amount, currency, rail, metadata)"
        " VALUES ('pi_racing', %s, %s, 100, 'usd', 'momo', '{}')",
        [acme.merchant.id, customer],
    )
    answer: dict = {}

    def delete() -> None:
        from django.db import connection

        try:
            answer["response"] = acme.call("DELETE", f"/v1/customers/{customer}")
        finally:
            connection.close()

    with caplog.at_level(logging.INFO):
        thread = threading.Thread(target=delete)
        thread.start()
        try:
            wait_for(
                lambda: scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                ),
                10,
                message="the delete waiting on the intent's lock",
            )
        finally:
            creator.commit()
            creator.close()
            thread.join(timeout=20)
    response = answer["response"]
    assert response.status_code == 200, response.content
    assert scalar("SELECT customer_id FROM payment_intents WHERE id = 'pi_racing'") is None
    assert scalar("SELECT count(*) FROM customers") == 0
    no_traceback(caplog)
