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
    answer's ``Request-Id``; its ``error`` object."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "code", "message", "param", "request_id"}
    assert body["error"]["request_id"] == response["Request-Id"]
    return body["error"]
