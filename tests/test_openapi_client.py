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


def test_the_generated_client_runs_a_manual_capture_payment_and_reads_its_events(generated, live_server, rails):
    """A payment, as a merchant runs it through the client: created for manual capture,
    confirmed (the rail called), authorized (the worker's poll, run here in process),
    captured in part, settled; then its events read back through the client."""
    from jobs.runner.worker import Worker
    from tests.charges_support import intent_status
    from tests.conftest import wait_for

    assert generated.returncode == 0, generated.stdout + generated.stderr
    client_module = importlib.import_module(PACKAGE)
    models = importlib.import_module(f"{PACKAGE}.models")

    def operation(name: str):
        return importlib.import_module(f"{PACKAGE}.api.payment_intents.{name}")

    client = client_module.AuthenticatedClient(base_url=live_server.url, token=MerchantClient("Acme").key)
    body = models.CreatePaymentIntentBody(
        amount=2500,
        currency="usd",
        rail="sandbox_push",
        capture_method=models.CreatePaymentIntentBodyCaptureMethod.MANUAL,
    )
    intent = operation("create_payment_intent").sync(client=client, body=body)
    assert isinstance(intent, models.PaymentIntent), intent
    confirmed = operation("confirm_payment_intent").sync(client=client, intent_id=intent.id)
    assert confirmed.status.value == "processing"

    worker = Worker(worker_id="w-client")

    def settled_to(status: str):
        def reached() -> bool:
            worker.run_once()
            return intent_status(intent.id) == status

        return reached

    wait_for(settled_to("requires_capture"), timeout=15, interval=0.05, message="the authorization")
    got = operation("retrieve_payment_intent").sync(client=client, intent_id=intent.id)
    assert (got.status.value, got.amount_capturable) == ("requires_capture", 2500)

    captured = operation("capture_payment_intent").sync(
        client=client, intent_id=intent.id, body=models.CapturePaymentIntentBody(amount_to_capture=2000)
    )
    assert isinstance(captured, models.PaymentIntent) and captured.status.value == "processing", captured
    wait_for(settled_to("succeeded"), timeout=15, interval=0.05, message="the capture")
    got = operation("retrieve_payment_intent").sync(client=client, intent_id=intent.id)
    assert (got.amount_received, got.charge.amount_captured) == (2000, 2000)

    list_events = importlib.import_module(f"{PACKAGE}.api.events.list_events")
    types = [event.type_.value for event in list_events.sync(client=client).data]
    assert types[:3] == ["payment_intent.succeeded", "charge.captured", "payment_intent.processing"]
    assert "payment_intent.amount_capturable_updated" in types
