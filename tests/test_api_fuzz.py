"""Schemathesis fuzzes the whole ``/v1`` description against a live server (pytest-django's
``live_server``: a real socket, the real URLconf, the real database) with a merchant key,
and finds no 5xx, no answer that breaks the description and no undocumented status.

The normal run is a CI budget (a few examples per operation and mode, derandomized); the
``rehearse`` run (``make rehearse``) tries ten times as many, new ones each run.
"""

from __future__ import annotations

import httpx
import pytest

from tests.fuzz_support import fuzz, hostile
from tests.rail_support import sandbox_rail  # noqa: F401 - fixture
from tests.refund_support import RefundingMerchant
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

# Examples per operation, generation mode and set of path ids: about 25 s for the whole API
# at 3 on the shared 2-core machine, about 4 min at 30.
CI_EXAMPLES = 3
REHEARSE_EXAMPLES = 30


@pytest.fixture
def served(live_server, settings, tmp_path, sandbox_rail):  # noqa: F811 - the fixture
    """A merchant with one of everything, and the ids to put in paths."""
    from tests.charges_support import use_rails

    use_rails(settings, tmp_path, sandbox_rail.rails())
    settings.VPAY_PUBLIC_URL = live_server.url
    # Fuzzing is a burst; 429 is documented (test_openapi).
    settings.VPAY_API_RATE_LIMIT = settings.VPAY_WEBHOOK_TEST_RATE_LIMIT = 0
    settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT = settings.VPAY_OAUTH_TOKEN_RATE_LIMIT = 0
    acme = RefundingMerchant("Acme")
    customer = acme.call("POST", "/v1/customers", {"email": "a@example.com", "metadata": {"k": "v"}}).json()
    paid = acme.paid_intent()
    refund = acme.refund(paid).json()
    open_intent = acme.intent(customer=customer["id"])
    canceled = acme.intent()
    assert acme.call("POST", f"/v1/payment_intents/{canceled['id']}/cancel").status_code == 200
    session = acme.call(
        "POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "sandbox_redirect"}
    ).json()
    endpoint = acme.call(
        "POST", "/v1/webhook_endpoints", {"url": "https://hooks.example.com/vpay", "enabled_events": ["*"]}
    ).json()
    ids = {
        "customer_id": customer["id"],
        "intent_id": open_intent["id"],
        "refund_id": refund["id"],
        "session_id": session["id"],
        "endpoint_id": endpoint["id"],
        "event_id": Event.objects.filter(merchant=acme.merchant).values_list("id", flat=True).first(),
    }
    assert all(ids.values()), ids
    return live_server.url, acme.key, ids


def _assert_clean(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} operation(s) failed:\n\n" + "\n\n".join(failures)


def test_schemathesis_finds_nothing_within_the_ci_budget(served):
    url, key, ids = served
    assert httpx.get(url + "/v1/openapi.json").status_code == 200
    _assert_clean(fuzz(url, key, examples=CI_EXAMPLES, real_ids=ids))


def test_inputs_that_once_answered_500_answer_a_listed_4xx_on_every_operation(served):
    url, key, ids = served
    _assert_clean(hostile(url, key, real_ids=ids))


@pytest.mark.rehearse
def test_schemathesis_finds_nothing_with_a_bigger_budget(served):
    url, key, ids = served
    _assert_clean(fuzz(url, key, examples=REHEARSE_EXAMPLES, real_ids=ids, derandomize=False))
