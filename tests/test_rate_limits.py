"""Per-merchant rate limits on /v1: 429 with Retry-After in the error shape, counted in
PostgreSQL across processes (a live server's connection and the test client's share it)."""

from __future__ import annotations

import time

import httpx
import pytest
from django.test import Client

from merchants.services import merchant_create

pytestmark = pytest.mark.django_db


def _get(key: str):
    return Client().get("/v1/customers", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_over_the_limit_is_a_429_with_retry_after_and_the_error_shape_per_merchant(settings):
    settings.VPAY_API_RATE_LIMIT, settings.VPAY_API_RATE_LIMIT_WINDOW_SECONDS = 3, 60
    _, acme = merchant_create(name="Acme")
    _, globex = merchant_create(name="Globex")
    assert [_get(acme).status_code for _ in range(3)] == [200, 200, 200]
    refused = _get(acme)
    assert refused.status_code == 429
    assert refused.json() == {
        "error": {
            "type": "rate_limit_error",
            "code": "rate_limited",
            "message": "Too many requests: at most 3 per 60 s for a merchant. Retry after the Retry-After seconds.",
            "param": None,
            "request_id": refused["Request-Id"],
        }
    }
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert _get(globex).status_code == 200  # another merchant's window is its own
    # A write is refused before it runs.
    posted = Client().post(
        "/v1/customers", {"name": "x"}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {acme}"
    )
    assert posted.status_code == 429 and not _get(globex).json()["data"]


def test_the_limit_is_off_at_zero(settings):
    settings.VPAY_API_RATE_LIMIT = 0
    _, key = merchant_create(name="Acme")
    assert all(_get(key).status_code == 200 for _ in range(5))


@pytest.mark.django_db(transaction=True)
def test_the_count_is_shared_across_connections_and_a_new_window_admits_again(live_server, settings):
    settings.VPAY_API_RATE_LIMIT, settings.VPAY_API_RATE_LIMIT_WINDOW_SECONDS = 2, 2
    _, key = merchant_create(name="Acme")

    def over_http() -> httpx.Response:
        return httpx.get(live_server.url + "/v1/customers", headers={"Authorization": f"Bearer {key}"}, timeout=10)

    # Start at the beginning of a window so the three requests share one.
    while time.time() % 2 > 0.5:
        time.sleep(0.05)
    first, second, third = over_http().status_code, _get(key).status_code, over_http()
    if third.status_code != 429 and time.time() % 2 < 0.5:  # the host crossed a window boundary; rare
        pytest.skip("the window turned between requests")
    assert (first, second, third.status_code) == (200, 200, 429)
    time.sleep(int(third.headers["Retry-After"]))
    assert over_http().status_code == 200


def test_a_keyed_window_refuses_past_its_limit_and_the_sweep_deletes_keys_idle_for_an_hour():
    from api.ratelimit import rate_limit_key, sweep_stale_windows
    from tests.charges_support import scalar, sql
    from vpay.errors import RateLimited

    for _ in range(2):
        rate_limit_key(key="probe:a", limit=2, window=60, what="for a probe")
    with pytest.raises(RateLimited) as refused:
        rate_limit_key(key="probe:a", limit=2, window=60, what="for a probe")
    assert refused.value.message.endswith("at most 2 per 60 s for a probe. Retry after the Retry-After seconds.")
    rate_limit_key(key="probe:b", limit=2, window=60, what="for a probe")  # its own window
    sql("UPDATE api_rate_limit_keys SET window_start = now() - interval '61 minutes' WHERE key = 'probe:b'")
    ctx = type("Ctx", (), {"heartbeat": lambda self: None})()
    assert sweep_stale_windows(ctx).count == 1
    assert scalar("SELECT array_agg(key) FROM api_rate_limit_keys") == ["probe:a"]


def test_webhook_test_events_are_rate_limited_per_merchant(settings):
    from tests.api_support import MerchantClient
    from tests.charges_support import scalar

    settings.VPAY_WEBHOOK_TEST_RATE_LIMIT, settings.VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS = 2, 60
    acme, globex = MerchantClient("Acme"), MerchantClient("Globex")
    endpoint = {"url": "https://hooks.example.com/vpay", "enabled_events": ["*"]}
    acme_test = f"/v1/webhook_endpoints/{acme.call('POST', '/v1/webhook_endpoints', endpoint).json()['id']}/test"
    globex_test = f"/v1/webhook_endpoints/{globex.call('POST', '/v1/webhook_endpoints', endpoint).json()['id']}/test"
    assert [acme.call("POST", acme_test).status_code for _ in range(2)] == [200, 200]
    refused = acme.call("POST", acme_test)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert "for a merchant's webhook test events" in refused.json()["error"]["message"]
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert scalar("SELECT count(*) FROM webhook_deliveries") == 2  # the refused call made none
    assert globex.call("POST", globex_test).status_code == 200  # its own window
