"""What a ``/v1`` request answers when the database connection dies under it. Before a write
could have happened, or for a read, a 503 the client retries. Under a write without an
Idempotency-Key, nobody can say whether the COMMIT landed, so no "retry shortly" that could
make a second refund: a 500 ``outcome_unknown`` without ``Retry-After``."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError
from django.test import RequestFactory

from api.framework import route
from merchants.services import create_merchant

pytestmark = pytest.mark.django_db


@route("GET", "POST")
def _link_dies(request):
    try:
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    except psycopg.Error as exc:
        raise OperationalError(str(exc)) from exc


@pytest.fixture
def key():
    return create_merchant("Acme")[1]


def call(method: str, key: str, **headers):
    factory = RequestFactory()
    make = factory.get if method == "GET" else factory.post
    request = make("/v1/x", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", **headers)
    return _link_dies(request)


def test_a_read_whose_link_dies_is_a_503_to_retry(key):
    answer = call("GET", key)
    assert (answer.status_code, answer["Retry-After"]) == (503, "2")


def test_a_write_whose_link_dies_is_an_unknown_outcome_not_a_retry(key):
    answer = call("POST", key)
    assert answer.status_code == 500 and "Retry-After" not in answer
    assert b"outcome_unknown" in answer.content


def test_a_write_under_an_idempotency_key_may_be_retried_its_replay_is_safe(key):
    answer = call("POST", key, HTTP_IDEMPOTENCY_KEY="k-1")
    assert (answer.status_code, answer["Retry-After"]) == (503, "2")
