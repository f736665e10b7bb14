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
