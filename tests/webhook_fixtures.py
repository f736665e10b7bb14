"""Shared webhook fixtures (registered in tests/conftest.py's pytest_plugins), in place of
the setup each webhook test file wrote for itself. ``acme`` is conftest's merchant client."""

from __future__ import annotations

import ipaddress

import pytest

from tests.factories.webhooks import EndpointFactory


@pytest.fixture
def acme_endpoint(acme):
    """Acme's webhook endpoint, subscribed to every event type; its secret on ``.secret``."""
    return EndpointFactory(merchant=acme.merchant)


@pytest.fixture
def loopback_receivers(settings):
    """Deliveries may go to 127.0.0.1, where the sandbox receivers listen: the SSRF guard
    refuses a loopback address unless ``VPAY_WEBHOOK_ALLOW_CIDRS`` names it."""
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
