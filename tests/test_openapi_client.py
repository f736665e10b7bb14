"""The description makes a Python client: openapi-python-client generates one from the live
``GET /v1/openapi.json`` without a warning, and the generated client, imported, talks to
the real app (``live_server``: a real socket, the real URLconf and database)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.api_support import MerchantClient
from vpay.api_version import CURRENT

pytestmark = pytest.mark.django_db(transaction=True)

PACKAGE = "vpay_test_client"


@pytest.fixture
def generated(live_server, settings, tmp_path, monkeypatch):
    """The client package generated from the served description, importable; and the
    generator's output."""
    settings.VPAY_PUBLIC_URL = live_server.url
    description = tmp_path / "openapi.json"
    description.write_bytes(httpx.get(live_server.url + "/v1/openapi.json").content)
    config = tmp_path / "config.yml"
    config.write_text(f"project_name_override: {PACKAGE}\npackage_name_override: {PACKAGE}\npost_hooks: []\n")
    generator = Path(sys.executable).with_name("openapi-python-client")
    run = subprocess.run(
        [generator, "generate", "--path", description, "--meta", "none", "--config", config,
         "--output-path", tmp_path / PACKAGE],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    yield run
    for name in [name for name in sys.modules if name.startswith(PACKAGE)]:
        del sys.modules[name]


def test_the_description_generates_a_client_without_warnings(generated):
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    assert "warning" not in output.lower(), output


def test_the_generated_client_creates_and_cancels_an_intent_and_reads_its_events(generated, live_server):
    assert generated.returncode == 0, generated.stdout + generated.stderr
    client_module = importlib.import_module(PACKAGE)
    intents = importlib.import_module(f"{PACKAGE}.api.payment_intents")
    models = importlib.import_module(f"{PACKAGE}.models")
    acme = MerchantClient("Acme")
    client = client_module.AuthenticatedClient(base_url=live_server.url, token=acme.key)

    create = importlib.import_module(f"{intents.__name__}.create_payment_intent")
    made = create.sync_detailed(
        client=client, body=models.CreatePaymentIntentBody(amount=1000, currency="usd", rail="sandbox_push")
    )
    assert made.status_code == 200, made.content
    assert made.headers["Vpay-Version"] == CURRENT and made.headers["Request-Id"].startswith("req_")
    intent = made.parsed
    assert isinstance(intent, models.PaymentIntent) and intent.amount == 1000

    cancel = importlib.import_module(f"{intents.__name__}.cancel_payment_intent")
    canceled = cancel.sync(client=client, intent_id=intent.id, body=models.CancelPaymentIntentBody())
    assert isinstance(canceled, models.PaymentIntent) and canceled.status.value == "canceled"

    list_events = importlib.import_module(f"{PACKAGE}.api.events.list_events")
    events = list_events.sync(client=client)
    event, created = events.data  # newest first
    assert isinstance(created, models.Event) and created.type_.value == "payment_intent.created"
    assert isinstance(event, models.Event)
    assert event.type_.value == "payment_intent.canceled" and event.api_version.value == CURRENT
    assert event.data.object_["id"] == intent.id

    refused = create.sync(client=client, body=models.CreatePaymentIntentBody(amount=0, currency="usd", rail="x"))
    assert isinstance(refused, models.Error) and refused.error.request_id.startswith("req_")
