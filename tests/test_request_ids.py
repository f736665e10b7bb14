"""Every ``/v1`` answer carries a fresh ``Request-Id`` (api.middleware); an error body carries
the same id, and so does every log line written while serving the request (vpay.logging's
RequestIdFilter on the configured handler). Through Django's test client."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from django.test import Client

from tests.api_support import MerchantClient, error_of
from vpay.logging import RequestIdFilter
from vpay.request_context import current_request_id

pytestmark = pytest.mark.django_db

REQUEST_ID = re.compile(r"^req_[A-Za-z0-9]{24}$")


@pytest.fixture
def acme():
    return MerchantClient("Acme")


@pytest.fixture
def log_lines():
    """What the configured console handler (settings.LOGGING: its filters, the JSON
    formatter) writes, one parsed line each."""
    from vpay.logging import JsonFormatter

    handler = next(h for h in logging.getLogger().handlers if any(isinstance(f, RequestIdFilter) for f in h.filters))
    stream, formatter = io.StringIO(), handler.formatter
    old = handler.setStream(stream)
    handler.setFormatter(JsonFormatter())
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        handler.setStream(old)
        handler.setFormatter(formatter)


def test_a_success_carries_a_fresh_request_id_each_time(acme):
    first, second = acme.call("GET", "/v1/customers"), acme.call("GET", "/v1/customers")
    assert first.status_code == second.status_code == 200
    assert REQUEST_ID.match(first["Request-Id"]) and REQUEST_ID.match(second["Request-Id"])
    assert first["Request-Id"] != second["Request-Id"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/customers/cus_missing", 404),  # a view's refusal
        ("POST", "/v1/customers", 400),  # the body's (an unknown field)
        ("GET", "/v1/no_such_route", 404),  # the catch-all
        ("PUT", "/v1/customers", 405),
    ],
)
def test_an_error_body_carries_the_answers_request_id(acme, method, path, status):
    response = acme.call(method, path, {"emial": "x"} if method == "POST" else None)
    assert response.status_code == status
    assert REQUEST_ID.match(error_of(response)["request_id"])  # error_of: the body's id is the header's


def test_an_unauthenticated_refusal_and_a_refused_host_carry_it_too(settings):
    refused = Client().get("/v1/customers")
    assert refused.status_code == 401 and error_of(refused)["request_id"] == refused["Request-Id"]
    settings.ALLOWED_HOSTS = ["api.example"]
    bad_host = Client().get("/v1/customers", HTTP_HOST="evil.example")
    assert bad_host.status_code == 400 and error_of(bad_host)["request_id"] == bad_host["Request-Id"]


def test_a_request_id_the_client_sends_is_not_honoured(acme):
    sent = "req_" + "a" * 24
    response = acme.call("GET", "/v1/customers", HTTP_REQUEST_ID=sent, HTTP_X_REQUEST_ID=sent)
    assert REQUEST_ID.match(response["Request-Id"]) and response["Request-Id"] != sent


def test_other_paths_have_no_request_id():
    assert "Request-Id" not in Client().get("/admin/login/")


def test_every_log_line_of_a_request_carries_its_id_and_no_line_after_it(acme, log_lines, monkeypatch):
    def boom(**_kwargs):
        raise RuntimeError("the merchant lookup broke")

    monkeypatch.setattr("api.framework.credential_authenticate", boom)
    response = acme.call("GET", "/v1/customers")
    assert response.status_code == 500
    request_id = error_of(response)["request_id"]
    lines = log_lines()
    failed = [line for line in lines if line["message"] == "api request failed"]
    # Django's own line about the 500 is written after the middleware has returned.
    django_line = [line for line in lines if line["logger"] == "django.request"]
    assert failed and django_line, lines
    assert all(line.get("request_id") == request_id for line in failed + django_line), lines
    assert current_request_id() is None  # cleared once the answer was sent
    logging.getLogger("vpay.test").warning("between requests")
    assert "request_id" not in log_lines()[-1]
