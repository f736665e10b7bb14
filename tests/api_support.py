"""A test client that speaks the /v1 API for one merchant (Django's test client, real database)."""

from __future__ import annotations

import json

from django.test import Client

from merchants.services import api_key_issue
from tests.factories import MerchantFactory


class MerchantClient:
    """A new merchant and its key; ``call`` sends JSON with ``Authorization: Bearer``."""

    def __init__(self, name: str) -> None:
        self.merchant = MerchantFactory(name=name)
        self.key = self.merchant.key
        self.client = Client()

    def go_live(self, settings) -> None:
        """Switch the deployment to live mode and hold a live key: a test key is refused there."""
        settings.LIVE_MODE = True
        self.key = api_key_issue(merchant=self.merchant)

    def call(self, method: str, path: str, body=None, *, key: str | None = None, raw: bytes | None = None, **headers):
        """``key`` is an Idempotency-Key; ``raw`` replaces the JSON body with these bytes."""
        if key is not None:
            headers["HTTP_IDEMPOTENCY_KEY"] = key
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.generic(
            method, path, data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {self.key}", **headers
        )


def error_of(response) -> dict:
    """The body of a refusal, checked to be the common error format, its ``request_id`` the
    answer's ``Request-Id`` (every /v1 answer's; a rail's callback route has none); its
    ``error`` object."""
    body = response.json()
    with_id = response.has_header("Request-Id")
    expected = {"type", "code", "message", "param"} | ({"request_id"} if with_id else set())
    assert set(body) == {"error"} and set(body["error"]) == expected, body
    if with_id:
        assert body["error"]["request_id"] == response["Request-Id"]
    return body["error"]


def refusal_of(response) -> dict:
    """:func:`error_of` without its request id: what a test compares whole."""
    return {k: v for k, v in error_of(response).items() if k != "request_id"}
