"""``Vpay-Version`` (vpay.api_version): accepted and echoed on every routed ``/v1`` answer, the
current version when absent, a 400 when it names no version; an event carries the version
its object was rendered in, on ``/v1/events`` and in its webhook body alike."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from api.openapi import describe_api
from customers.models import Customer
from tests.api_support import MerchantClient, error_of
from vpay.api_version import CURRENT, SUPPORTED
from webhooks.attempt_sql import load_delivery
from webhooks.events import emit, render_event
from webhooks.models import Event, WebhookDelivery
from webhooks.services.delivery import render_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme():
    return MerchantClient("Acme")


def test_the_current_version_is_a_date_and_supported():
    assert CURRENT in SUPPORTED and len(CURRENT) == 10 and CURRENT[4] == CURRENT[7] == "-"


def test_without_the_header_the_answer_is_in_the_current_version_and_says_so(acme):
    assert acme.call("GET", "/v1/customers")["Vpay-Version"] == CURRENT
    refused = acme.call("GET", "/v1/customers/cus_missing")
    assert refused.status_code == 404 and refused["Vpay-Version"] == CURRENT


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_supported_version_is_accepted_and_echoed(acme, version):
    response = acme.call("POST", "/v1/customers", {"name": "Ada"}, HTTP_VPAY_VERSION=version)
    assert response.status_code == 200 and response["Vpay-Version"] == version


@pytest.mark.parametrize("version", ["2020-01-01", "", "latest", CURRENT + " "])
def test_an_unknown_version_is_a_400_that_writes_nothing(acme, version):
    response = acme.call("POST", "/v1/customers", {"name": "Ada"}, HTTP_VPAY_VERSION=version)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "api_version_unknown" and CURRENT in error["message"]
    assert "Vpay-Version" not in response  # it was answered in no version
    assert not Customer.objects.exists()


def test_the_description_declares_the_header_and_the_refusal():
    description = describe_api()
    assert description["components"]["schemas"]["api_version"]["enum"] == list(SUPPORTED)
    operation = description["paths"]["/v1/customers"]["post"]
    header = next(p for p in operation["parameters"] if p["name"] == "Vpay-Version")
    assert header["in"] == "header" and not header["required"]
    assert "`api_version_unknown`" in operation["responses"]["400"]["description"]
    assert operation["responses"]["200"]["headers"]["Vpay-Version"]["required"]


def test_an_event_carries_its_api_version_on_the_api_and_in_its_webhook_body(acme):
    endpoint = acme.call("POST", "/v1/webhook_endpoints", {"url": "https://h.example/", "enabled_events": ["*"]})
    assert endpoint.status_code == 200, endpoint.content
    assert acme.call("POST", f"/v1/webhook_endpoints/{endpoint.json()['id']}/test").status_code == 200
    event = Event.objects.get(merchant=acme.merchant)
    assert event.api_version == CURRENT
    assert acme.call("GET", f"/v1/events/{event.id}").json()["api_version"] == CURRENT
    delivery = WebhookDelivery.objects.get(event=event)
    loaded = load_delivery(delivery.pk)
    assert loaded is not None and json.loads(render_body(loaded.event))["api_version"] == CURRENT


def test_an_event_written_before_events_carried_a_version_renders_without_one(acme):
    with transaction.atomic():
        event = emit(acme.merchant, "customer.deleted", {"id": "cus_x", "object": "customer", "deleted": True})
    Event.objects.filter(pk=event.pk).update(api_version=None)
    assert "api_version" not in render_event(Event.objects.get(pk=event.pk))
    assert "api_version" not in acme.call("GET", f"/v1/events/{event.id}").json()
