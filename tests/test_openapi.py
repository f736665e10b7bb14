"""The OpenAPI description (``GET /v1/openapi.json``) and the routes agree: every ``/v1``
route is described, every described operation exists, every object a view renders is its
schema key for key, and every status ``route`` answers is listed. Through Django's test
client against the real database; ``tests/test_api_fuzz.py`` fuzzes it over a live server.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from django.test import Client
from openapi_spec_validator import validate

from api import schemas
from api.framework import unknown_route
from api.openapi import describe_api, v1_routes
from tests.api_support import MerchantClient
from tests.rail_support import sandbox_rail  # noqa: F401 - fixture
from tests.refund_support import RefundingMerchant

pytestmark = pytest.mark.django_db

METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH")


@pytest.fixture
def description():
    return describe_api()


@pytest.fixture
def acme():
    return MerchantClient("Acme")


def _concrete(path: str) -> str:
    return re.sub(r"{\w+}", "x_1", path)


def _conforms(description: dict, path: str, method: str, response) -> None:
    """The answer is one the description lists for this operation, with a body that matches it."""
    responses = description["paths"][path][method.lower()]["responses"]
    assert str(response.status_code) in responses, (path, method, response.status_code, response.content)
    content = responses[str(response.status_code)].get("content")
    if content is None:
        return
    (media_type, declared), *_ = content.items()
    assert response["Content-Type"].startswith(media_type)
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema", **declared["schema"]}
    root["components"] = description["components"]
    jsonschema.validate(json.loads(response.content), root)


def test_the_description_is_valid_openapi_3_1(description):
    validate(description)
    assert description["openapi"] == "3.1.0"


def test_every_v1_route_is_described_and_nothing_else(description):
    routed = {path for path, view in v1_routes() if getattr(view, "operations", None)}
    unrouted = [view for _path, view in v1_routes() if not getattr(view, "operations", None)]
    # Only the catch-all JSON 404 (api.urls and the bare /v1) declares nothing.
    assert unrouted == [unknown_route, unknown_route]
    assert set(description["paths"]) == routed
    for path, view in v1_routes():
        for op in getattr(view, "operations", ()):
            assert op.method.lower() in description["paths"][path], (path, op.method)


def test_every_described_operation_exists_and_every_other_method_is_405_with_allow(description, acme):
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {acme.key}"}
    for path, operations in description["paths"].items():
        for method in METHODS:
            response = client.generic(method, _concrete(path), "", content_type="application/json", **auth)
            if method.lower() in operations:
                assert response.status_code != 405, (method, path)
                if response.status_code == 404:
                    assert response.json()["error"]["code"] != "route_missing", (method, path)
                _conforms(description, path, method, response)
            else:
                assert response.status_code == 405, (method, path, response.status_code)
                allowed = {m.strip() for m in response["Allow"].split(",")}
                assert allowed == {m.upper() for m in operations}, (path, allowed)


def test_every_routed_operation_lists_the_statuses_route_answers(description):
    for path, operations in description["paths"].items():
        for method, operation in operations.items():
            if operation.get("security") == []:
                continue  # the public ones (the description, the token endpoint) answer their own
            listed = set(operation["responses"])
            assert {"200", "400", "401", "413", "429", "500", "503"} <= listed, (method, path)
            assert "Retry-After" in operation["responses"]["429"]["headers"]
            assert "Retry-After" in operation["responses"]["503"]["headers"]
            if method == "post":
                assert {"409", "415"} <= listed, path
                assert any(p["name"] == "Idempotency-Key" for p in operation["parameters"])
            if "{" in path:
                assert "404" in listed, (method, path)


def test_a_rate_limited_answer_is_the_documented_429(description, acme, settings):
    settings.VPAY_API_RATE_LIMIT = 1
    settings.VPAY_API_RATE_LIMIT_WINDOW_SECONDS = 3600
    assert acme.call("GET", "/v1/customers").status_code == 200
    refused = acme.call("GET", "/v1/customers")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    _conforms(description, "/v1/customers", "GET", refused)


def test_the_security_schemes_are_the_credentials_modules(description):
    from merchants.credentials import SCHEMES

    declared = description["components"]["securitySchemes"]
    assert declared["secret_key"] == {"type": "http", "scheme": "bearer", "description": SCHEMES[0].description}
    assert declared["oauth_client"]["flows"]["clientCredentials"]["tokenUrl"].endswith("/v1/oauth/token")
    assert description["security"] == [{"secret_key": []}, {"oauth_client": []}]
    token = description["paths"]["/v1/oauth/token"]["post"]
    assert token["security"] == []
    form = token["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
    assert {"grant_type", "client_assertion_type", "client_assertion"} <= set(form["required"])
    assert "client_assertion" in description["info"]["description"]


def test_the_description_is_public_and_cacheable():
    client = Client()
    first = client.get("/v1/openapi.json")
    assert first.status_code == 200 and first["Content-Type"] == "application/json"
    assert first["Cache-Control"] == "public, max-age=300" and first["ETag"]
    again = client.get("/v1/openapi.json", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and again.content == b""
    refused = client.post("/v1/openapi.json")
    assert refused.status_code == 405 and refused["Allow"] == "GET"
    assert json.loads(first.content) == describe_api()


def test_a_new_route_is_described_by_being_routed(settings):
    settings.ROOT_URLCONF = "tests.openapi_urls"
    described = describe_api()
    ping = described["paths"]["/v1/pings/{ping_id}"]
    assert ping["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"] == {
        "note": {"type": "string", "maxLength": 10}
    }
    assert ping["post"]["responses"]["200"]["content"]["application/json"]["schema"] == schemas.ref("customer")
    # A bare method string is described too, with what every route answers.
    assert ping["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {"type": "object"}
    validate(described)


@pytest.mark.django_db(transaction=True)
def test_every_rendered_object_is_its_schema_key_for_key(description, settings, tmp_path, sandbox_rail):  # noqa: F811
    from tests.charges_support import use_rails

    use_rails(settings, tmp_path, sandbox_rail.rails())
    acme = RefundingMerchant("Acme")
    seen: dict[str, dict] = {}

    def call(method: str, path: str, described: str, body=None) -> dict:
        response = acme.call(method, path, body)
        assert response.status_code == 200, response.content
        _conforms(description, described, method, response)
        return response.json()

    def keep(obj: dict, name: str) -> None:
        seen[name] = obj
        for nested in obj.values():
            if isinstance(nested, dict) and isinstance(nested.get("object"), str) and "deleted" not in nested:
                keep(nested, nested["object"])

    customer = call("POST", "/v1/customers", "/v1/customers", {"email": "a@example.com"})
    keep(customer, "customer")
    paid = acme.paid_intent()
    keep(call("GET", f"/v1/payment_intents/{paid}", "/v1/payment_intents/{intent_id}"), "payment_intent")
    keep(call("POST", "/v1/refunds", "/v1/refunds", {"payment_intent": paid}), "refund")
    session = {"amount": 500, "currency": "usd", "rail": "sandbox_redirect", "success_url": "https://x.example/ok"}
    keep(call("POST", "/v1/checkout/sessions", "/v1/checkout/sessions", session), "checkout.session")
    endpoint = call(
        "POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints", {"url": "https://h.example/", "enabled_events": ["*"]}
    )
    keep(endpoint, "webhook_endpoint")
    at = f"/v1/webhook_endpoints/{endpoint['id']}"
    keep(call("POST", f"{at}/test", "/v1/webhook_endpoints/{endpoint_id}/test"), "webhook_delivery")
    call("GET", f"{at}/deliveries", "/v1/webhook_endpoints/{endpoint_id}/deliveries")
    keep(call("GET", "/v1/event_types", "/v1/event_types")["data"][0], "event_type")
    call("POST", f"/v1/payment_intents/{acme.intent()['id']}/cancel", "/v1/payment_intents/{intent_id}/cancel")
    events = call("GET", "/v1/events", "/v1/events")
    keep(events["data"][0], "event")
    keep(call("DELETE", f"/v1/customers/{customer['id']}", "/v1/customers/{customer_id}"), "deleted_customer")
    deleted = call("DELETE", f"/v1/webhook_endpoints/{endpoint['id']}", "/v1/webhook_endpoints/{endpoint_id}")
    keep(deleted, "deleted_webhook_endpoint")
    for name in ("payment_intents", "refunds", "customers", "webhook_endpoints"):
        call("GET", f"/v1/{name}", f"/v1/{name}")

    objects = {name: schema for name, schema in schemas.OBJECTS.items() if not name.startswith(("error", "oauth"))}
    assert set(seen) == set(objects), set(objects) ^ set(seen)
    for name, obj in seen.items():
        declared = objects[name]["properties"]
        optional = set(declared) - set(objects[name]["required"])
        assert set(declared) - optional <= set(obj) <= set(declared), (name, set(obj) ^ set(declared))


def test_metadata_is_the_merchants_own_strings_even_with_an_object_key(acme, description):
    # livemode is added to our objects at any depth; metadata is never one of them.
    response = acme.call("POST", "/v1/customers", {"metadata": {"object": "invoice", "x": "1"}})
    assert response.status_code == 200
    assert response.json()["metadata"] == {"object": "invoice", "x": "1"}
    _conforms(description, "/v1/customers", "POST", response)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("GET", "/v1/customers/cus_%00x", None, 404, "id"),
        ("GET", "/v1/customers?starting_after=cus_%00", None, 400, None),
        ("GET", "/v1/refunds?payment_intent=pi_%00", None, 400, None),
        ("POST", "/v1/customers", '{"name": "a\\u0000b"}', 400, "name"),
        ("POST", "/v1/customers", '{"metadata": {"k\\u0000": "v"}}', 400, "metadata"),
        ("POST", "/v1/customers", '{"metadata": {"k": "\\ud800"}}', 400, "metadata"),
    ],
)
def test_text_postgresql_cannot_store_is_refused_not_a_500(acme, description, method, path, body, status, param):
    response = acme.call(method, path, raw=(body or "").encode())
    assert response.status_code == status, response.content
    assert response.json()["error"]["param"] == param
