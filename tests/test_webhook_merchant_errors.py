"""What a merchant can read about a failed attempt says what kind of failure it was and
nothing about vpay's network: no resolved address, no exception class, no errno text
(issue 23 item 5: a DNS oracle). The detail reaches the operators: the log and the alert.

Through the API the merchant uses (``GET /v1/webhook_endpoints/{id}/deliveries``), against
the real database and real sockets; the nameserver is a resolver function (the same
parameter ``perform`` takes in production)."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket

import pytest
from django.db import transaction

from jobs.models import Alert
from tests.api_support import MerchantClient
from webhooks import attempt_errors, ssrf
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import DeliveryState, WebhookDelivery
from webhooks.services import delivery, endpoints, fanout

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)
# What must never reach a merchant: an address of either family, an exception class name,
# errno or resolver text.
LEAKS = re.compile(
    r"\b\d{1,3}(?:\.\d{1,3}){3}\b|[0-9a-f]{0,4}::[0-9a-f:]*|\b[A-Z]\w*(?:Error|Exception|Timeout)\b"
    r"|errno|gaierror|getaddrinfo|name or service|private|loopback|rfc ?1918|resolves to",
    re.IGNORECASE,
)


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = ()
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    settings.VPAY_WEBHOOK_CONNECT_TIMEOUT = 1.0


def one_attempt(api: MerchantClient, url: str, resolver=ssrf.system_resolver) -> tuple[dict, int]:
    """A test event sent to a new endpoint at ``url`` through the three steps; the
    endpoint's deliveries as the merchant reads them, and the delivery's id."""
    ep, _ = endpoints.create_endpoint(api.merchant, url=url, enabled_events=["*"])
    with transaction.atomic():
        emit(api.merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_1", "object": "payment_intent"})
    fanout.drain_once()
    d = WebhookDelivery.objects.get(endpoint=ep)
    begun = delivery.begin_attempt(d.pk)
    delivery.record(begun.lease, delivery.perform(begun.lease, resolver=resolver))
    listed = api.call("GET", f"/v1/webhook_endpoints/{ep.pk}/deliveries")
    assert listed.status_code == 200, listed.content
    return listed.json(), d.pk


def attempt_error(listed: dict) -> str:
    [row] = listed["data"]
    [attempt] = row["attempts"]
    return attempt["error"]


def test_a_host_resolving_to_a_private_address_is_refused_without_naming_it(caplog):
    acme = MerchantClient("Acme")
    caplog.set_level(logging.INFO, logger="webhooks.delivery")
    listed, _ = one_attempt(acme, "https://billing.internal.example/hook", lambda h, p: ["10.20.30.40"])
    assert listed["data"][0]["state"] == DeliveryState.REFUSED
    error = attempt_error(listed)
    assert error == attempt_errors.REFUSED
    assert not LEAKS.search(str(listed)), listed
    # The operators have the detail: in the alert and in the log line.
    [alert] = Alert.objects.filter(source="webhooks.delivery_refused")
    assert "10.20.30.40" in str(alert.details) and "private" in str(alert.details)
    assert any("10.20.30.40" in str(getattr(r, "error", "")) for r in caplog.records)


def test_a_host_the_resolver_does_not_know_is_reported_without_the_resolvers_words(caplog):
    def nxdomain(host, port):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    acme = MerchantClient("Acme")
    caplog.set_level(logging.INFO, logger="webhooks.delivery")
    listed, _ = one_attempt(acme, "https://redis.internal.example/hook", nxdomain)
    assert listed["data"][0]["state"] == DeliveryState.PENDING  # a DNS blip heals: the ladder goes on
    assert attempt_error(listed) == attempt_errors.UNRESOLVED
    assert not LEAKS.search(str(listed)), listed
    assert any("Name or service not known" in str(getattr(r, "error", "")) for r in caplog.records)


def test_a_refused_connection_is_reported_without_its_errno_or_address(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    with socket.socket() as probe:  # a port nobody listens on: the kernel refuses the connection
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listed, _ = one_attempt(MerchantClient("Acme"), f"http://127.0.0.1:{port}/hook")
    assert attempt_error(listed) == "the endpoint refused the connection"
    assert not LEAKS.search(str(listed).replace(f"127.0.0.1:{port}", "URL")), listed  # the URL is the merchant's own


def test_a_dropped_connection_is_reported_without_an_exception_class(receiver, settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = LOOPBACK
    listed, _ = one_attempt(MerchantClient("Acme"), receiver.url("/hooks/drop?mode=drop"))
    error = attempt_error(listed)
    assert error in (
        "the endpoint closed the connection or did not answer in HTTP",
        "the connection broke while reading the answer",
    )
    assert not LEAKS.search(error), error


def test_a_slow_nameserver_is_reported_as_a_timeout_without_detail():
    import threading

    release = threading.Event()

    def slow(host, port):
        release.wait(30)
        return ["127.0.0.1"]

    try:
        listed, _ = one_attempt(MerchantClient("Acme"), "https://slow.internal.example/hook", slow)
    finally:
        release.set()
    assert attempt_error(listed) == attempt_errors.RESOLVE_TIMEOUT
