"""The /v1 API base: keys, the error format, body validation, Idempotency-Key, pagination,
merchant isolation, and the events outbox read API. Through Django's test client against
the real database."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client

from api import idempotency
from customers.models import Customer
from merchants.models import ApiKey
from merchants.services import api_key_revoke
from tests.api_support import MerchantClient, error_of
from tests.factories import MerchantFactory
from tests.factories.webhooks import EndpointFactory, EventFactory
from webhooks.event_types import EventType
from webhooks.events import emit, render_event
from webhooks.models import Event

pytestmark = pytest.mark.django_db

# The body of a payment intent (or checkout session) the sandbox rail takes.
PAYMENT = {"amount": 500, "currency": "usd", "rail": "sandbox_push"}


def count(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


# --- keys ------------------------------------------------------------------------------


def test_createmerchant_prints_the_key_once_on_its_own_line_and_stores_only_a_digest(capsys):
    call_command("createmerchant", "Initech")
    out, err = capsys.readouterr()
    key = out.strip()
    assert out.count("\n") == 1 and key.startswith("sk_test_") and len(key) > 40
    assert key not in err and "acct_" in err
    stored = ApiKey.objects.get()
    assert stored.digest != key and key not in repr(stored) and stored.last4 == key[-4:]
    assert Client().get("/v1/customers", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200


def test_createmerchant_refuses_a_blank_name():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="1 to 200"):
        call_command("createmerchant", "   ")
    assert count("merchants") == 0


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "api_key_missing"),
        ("Basic abc", "api_key_invalid"),
        ("Bearer sk_test_not-a-real-key", "api_key_invalid"),
        ("Bearer pk_test_x", "api_key_invalid"),
    ],
)
def test_requests_without_a_valid_key_are_401_and_do_not_echo_the_key(acme, header, code):
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    response = Client().get("/v1/customers", **headers)
    assert response.status_code == 401
    error = error_of(response)
    assert error["type"] == "authentication_error" and error["code"] == code
    assert "not-a-real-key" not in response.content.decode()


def test_a_revoked_key_no_longer_authenticates(acme):
    api_key_revoke(key_id=ApiKey.objects.get().pk, reason="leaked in a CI log")
    assert acme.call("GET", "/v1/customers").status_code == 401


# --- the error format and body validation -------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "code", "param"),
    [
        (b"{not json", 400, "invalid_json", None),
        (b"[1, 2]", 400, "invalid_json", None),
        (b'{"email": NaN}', 400, "invalid_json", None),
        (b'{"emial": "a@b.c"}', 400, "parameter_unknown", "emial"),
        (b'{"email": 7}', 400, "parameter_invalid_type", "email"),
        (b'{"email": null}', 400, "parameter_invalid", "email"),
        (b'{"email": "no-at-sign"}', 400, "parameter_invalid", "email"),
        (b'{"name": "' + b"x" * 300 + b'"}', 400, "parameter_too_long", "name"),
        (b'{"metadata": {"k": 1}}', 400, "parameter_invalid", "metadata"),
        (b'{"metadata": []}', 400, "parameter_invalid_type", "metadata"),
        (b'{"name": "' + b"x" * (70 * 1024) + b'"}', 413, "body_too_large", None),
    ],
)
def test_bad_bodies_are_refused_with_a_clear_error_and_nothing_written(acme, raw, status, code, param):
    response = acme.call("POST", "/v1/customers", raw=raw)
    assert response.status_code == status
    error = error_of(response)
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]
    assert count("customers") == 0


def test_unknown_routes_and_wrong_methods_answer_in_the_error_format(acme):
    missing = acme.call("GET", "/v1/nothing/here")
    assert missing.status_code == 404 and error_of(missing)["code"] == "route_missing"
    wrong = acme.call("PUT", "/v1/customers")
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path", "content_type", "status", "code"),
    [
        ("POST", "/v1/nothing/here", "application/json", 404, "route_missing"),
        ("PUT", "/v1/nothing/here", "application/json", 404, "route_missing"),
        ("DELETE", "/v1/nothing/here", "application/json", 404, "route_missing"),
        ("PATCH", "/v1/nothing/here", "application/json", 404, "route_missing"),
        ("POST", "/v1/customers/", "application/json", 404, "route_missing"),
        ("POST", "/v1/", "application/json", 404, "route_missing"),
        ("POST", "/v1", "application/json", 404, "route_missing"),
        ("GET", "/v1", "application/json", 404, "route_missing"),
        ("PUT", "/v1/customers", "application/json", 405, "method_not_allowed"),
        ("OPTIONS", "/v1/customers", "application/json", 405, "method_not_allowed"),
        ("POST", "/v1/customers", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
        ("POST", "/v1/customers", "multipart/form-data; boundary=x", 415, "unsupported_media_type"),
    ],
)
def test_a_v1_refusal_is_json_even_with_csrf_checks_enforced(acme, method, path, content_type, status, code):
    """Browsers' CSRF rules do not apply to a bearer-key API: an unknown route is a JSON 404,
    never Django's 403 CSRF page (nor its HTML 404, nor an APPEND_SLASH redirect)."""
    client = Client(enforce_csrf_checks=True)
    body = "name=x" if "form" in content_type else '{"name": "x"}'
    response = client.generic(method, path, body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {acme.key}")
    assert (response.status_code, response["Content-Type"]) == (status, "application/json"), response.content
    assert error_of(response)["code"] == code
    assert count("customers") == 0


def test_a_host_django_refuses_is_a_json_400_under_v1_and_django_s_page_elsewhere(acme):
    """DisallowedHost is raised by a middleware, before any view: Django's handler answers."""
    client = Client(HTTP_HOST="evil.example")
    response = client.post("/v1/customers", "{}", content_type="application/json")
    assert (response.status_code, response["Content-Type"]) == (400, "application/json")
    assert error_of(response)["code"] == "invalid_request" and b"evil.example" not in response.content
    elsewhere = client.get("/metrics")
    assert elsewhere.status_code == 400 and "application/json" not in elsewhere["Content-Type"]


def test_every_v1_route_is_csrf_exempt_and_wrapped_in_the_error_format():
    """A /v1 view added without ``api.framework.route`` would answer CSRF's HTML 403 to a POST."""
    from django.urls import get_resolver

    def callbacks(patterns, prefix=""):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if hasattr(pattern, "url_patterns"):
                yield from callbacks(pattern.url_patterns, route)
            else:
                yield route, pattern.callback

    v1 = [(route, view) for route, view in callbacks(get_resolver().url_patterns) if route.startswith(("v1", "^v1"))]
    assert len(v1) > 10
    for route, view in v1:
        assert getattr(view, "csrf_exempt", False), route


def test_a_crash_inside_a_view_is_a_500_in_the_error_format_that_leaks_nothing(acme, monkeypatch):
    from customers import services

    def explode(*args, **kwargs):
        raise RuntimeError("secret detail sk_live_abc")

    monkeypatch.setattr(services, "create_customer", explode)
    response = acme.call("POST", "/v1/customers", {"name": "x"})
    assert response.status_code == 500
    error = error_of(response)
    assert error["type"] == "api_error" and "secret" not in response.content.decode()


# --- Idempotency-Key ----------------------------------------------------------------------


def test_the_same_key_and_body_replays_the_stored_answer_and_writes_once(acme):
    first = acme.call("POST", "/v1/customers", {"email": "a@example.com"}, key="k-1")
    again = acme.call("POST", "/v1/customers", {"email": "a@example.com"}, key="k-1")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert count("customers") == 1


def test_the_same_key_with_a_different_body_or_path_is_a_409(acme):
    acme.call("POST", "/v1/customers", {"email": "a@example.com"}, key="k-2")
    other_body = acme.call("POST", "/v1/customers", {"email": "b@example.com"}, key="k-2")
    assert other_body.status_code == 409 and error_of(other_body)["type"] == "idempotency_error"
    assert count("customers") == 1


def test_keys_are_per_merchant(acme, globex):
    a = acme.call("POST", "/v1/customers", {"name": "x"}, key="shared")
    b = globex.call("POST", "/v1/customers", {"name": "x"}, key="shared")
    assert a.json()["id"] != b.json()["id"]
    assert count("customers") == 2


def test_a_refused_request_stores_nothing_so_the_corrected_request_may_reuse_the_key(acme):
    assert acme.call("POST", "/v1/customers", {"email": 1}, key="k-3").status_code == 400
    assert acme.call("POST", "/v1/customers", {"email": "ok@example.com"}, key="k-3").status_code == 200


def test_an_expired_record_no_longer_replays_and_the_sweep_step_removes_it(acme):
    acme.call("POST", "/v1/customers", {"name": "x"}, key="old")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE api_idempotency_records SET created_at = now() - interval '25 hours'")
    again = acme.call("POST", "/v1/customers", {"name": "x"}, key="old")
    assert again.status_code == 200 and "Idempotent-Replayed" not in again
    assert count("customers") == 2
    with connection.cursor() as cursor:
        cursor.execute("UPDATE api_idempotency_records SET created_at = now() - interval '25 hours'")
    assert idempotency.sweep_expired_records(_NoHeartbeat()).count == 1
    assert count("api_idempotency_records") == 0


class _NoHeartbeat:
    def heartbeat(self) -> None:
        pass


def test_bad_idempotency_keys_are_refused(acme):
    response = acme.call("POST", "/v1/customers", {"name": "x"}, key="x" * 300)
    assert response.status_code == 400 and error_of(response)["code"] == "idempotency_key_invalid"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_requests_with_one_key_write_once_and_both_get_the_same_answer():
    """The first request's transaction stays open until the second has started, so the
    second finds no record, runs, and blocks on the key's unique index: it must roll its
    own write back and replay the first's answer."""
    api = MerchantClient("Concurrent")
    written = threading.Event()
    results = {}

    def first():
        try:
            with transaction.atomic():
                results["first"] = api.call("POST", "/v1/customers", {"name": "x"}, key="race")
                written.set()
                time.sleep(1.0)  # the second request is now inside its own transaction
        finally:
            connections.close_all()

    holder = threading.Thread(target=first)
    holder.start()
    assert written.wait(10)
    results["second"] = api.call("POST", "/v1/customers", {"name": "x"}, key="race")
    holder.join(20)
    assert results["first"].status_code == results["second"].status_code == 200
    assert results["second"]["Idempotent-Replayed"] == "true"
    assert results["first"].json()["id"] == results["second"].json()["id"]
    assert Customer.objects.count() == 1


# --- isolation and pagination ---------------------------------------------------------------


def test_a_merchant_sees_only_its_own_objects(acme, globex):
    theirs = globex.call("POST", "/v1/customers", {"name": "theirs"}).json()["id"]
    acme.call("POST", "/v1/customers", {"name": "mine"})
    assert [c["name"] for c in acme.call("GET", "/v1/customers").json()["data"]] == ["mine"]
    for method in ("GET", "POST", "DELETE"):
        response = acme.call(method, f"/v1/customers/{theirs}", {} if method == "POST" else None)
        assert response.status_code == 404 and error_of(response)["code"] == "resource_missing"
    assert Customer.objects.filter(id=theirs).exists()
    event = EventFactory(
        merchant=globex.merchant, type=EventType.CUSTOMER_DELETED, data={"id": "cus_x", "object": "customer"}
    )
    assert acme.call("GET", f"/v1/events/{event.id}").status_code == 404
    assert acme.call("GET", "/v1/events").json()["data"] == []


def test_no_single_object_route_reaches_another_merchants_object(acme, globex):
    """Every /v1 route that names an object answers another merchant's id with the same 404
    as a missing one, and changes nothing."""
    intent = globex.call("POST", "/v1/payment_intents", PAYMENT).json()["id"]
    session = globex.call("POST", "/v1/checkout/sessions", PAYMENT).json()["id"]
    endpoint = EndpointFactory(merchant=globex.merchant).pk
    routes = [
        ("GET", f"/v1/payment_intents/{intent}", None),
        ("POST", f"/v1/payment_intents/{intent}/confirm", None),
        ("POST", f"/v1/payment_intents/{intent}/cancel", None),
        ("GET", f"/v1/checkout/sessions/{session}", None),
        ("GET", f"/v1/webhook_endpoints/{endpoint}", None),
        ("POST", f"/v1/webhook_endpoints/{endpoint}", {"enabled_events": ["customer.deleted"]}),
        ("POST", f"/v1/webhook_endpoints/{endpoint}/rotate_secret", None),
        ("POST", f"/v1/webhook_endpoints/{endpoint}/disable", None),
        ("POST", f"/v1/webhook_endpoints/{endpoint}/enable", None),
        ("DELETE", f"/v1/webhook_endpoints/{endpoint}", None),
    ]
    for method, path, body in routes:
        response = acme.call(method, path, body)
        assert response.status_code == 404, (method, path, response.content)
        assert error_of(response)["code"] == "resource_missing"
    assert globex.call("GET", f"/v1/payment_intents/{intent}").json()["status"] == "requires_confirmation"
    theirs = globex.call("GET", f"/v1/webhook_endpoints/{endpoint}").json()
    assert theirs["enabled_events"] == ["*"] and theirs["status"] == "enabled"
    assert count("charges") == 0 and count("webhook_secrets") == 1


def test_cursor_pagination_walks_every_row_once_newest_first(acme):
    ids = [acme.call("POST", "/v1/customers", {"name": f"c{i}"}).json()["id"] for i in range(7)]
    seen, after, pages = [], None, 0
    while True:
        query = "?limit=3" + (f"&starting_after={after}" if after else "")
        page = acme.call("GET", "/v1/customers" + query).json()
        pages += 1
        seen += [c["id"] for c in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert pages == 3 and sorted(seen) == sorted(ids) and len(seen) == 7
    assert seen == [c.id for c in Customer.objects.order_by("-created_at", "-id")]


def _pages(api: MerchantClient, path: str, between=None) -> list[str]:
    """Every id a list call hands out, one row per page; ``between(last_id)`` runs after
    each page, before the next is asked for."""
    seen, after = [], None
    sep = "&" if "?" in path else "?"
    while True:
        response = api.call("GET", f"{path}{sep}limit=1" + (f"&starting_after={after}" if after else ""))
        assert response.status_code == 200, response.content
        page = response.json()
        seen += [row["id"] for row in page["data"]]
        if not page["has_more"]:
            return seen
        after = page["data"][-1]["id"]
        if between is not None:
            between(after)


def test_a_filtered_list_keeps_paging_after_its_cursor_leaves_the_filter(acme):
    """The last intent of a page moved on (it was confirmed) before the next page was asked
    for: its position in (created, id) still says where the next page starts."""
    ids = [acme.call("POST", "/v1/payment_intents", PAYMENT).json()["id"] for _ in range(3)]

    def moves_on(intent_id: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE payment_intents SET status = 'processing' WHERE id = %s", [intent_id])

    seen = _pages(acme, "/v1/payment_intents?status=requires_confirmation", between=moves_on)
    assert seen == ids[::-1]


def test_a_deleted_endpoint_as_the_cursor_still_pages_on(acme):
    ids = [endpoint.pk for endpoint in EndpointFactory.create_batch(3, merchant=acme.merchant)]
    seen = _pages(acme, "/v1/webhook_endpoints", between=lambda e: acme.call("DELETE", f"/v1/webhook_endpoints/{e}"))
    assert seen == ids[::-1]


def test_a_cursor_from_another_merchant_or_nowhere_is_a_404(acme, globex):
    acme.call("POST", "/v1/payment_intents", PAYMENT)
    theirs = globex.call("POST", "/v1/payment_intents", PAYMENT).json()["id"]
    for cursor in (theirs, "pi_nothing"):
        response = acme.call("GET", f"/v1/payment_intents?starting_after={cursor}")
        assert response.status_code == 404 and error_of(response)["code"] == "resource_missing"


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("?limit=0", "parameter_out_of_range"),
        ("?limit=x", "parameter_invalid_type"),
        ("?colour=red", "parameter_unknown"),
    ],
)
def test_bad_list_parameters_are_400(acme, query, code):
    response = acme.call("GET", "/v1/customers" + query)
    assert response.status_code == 400 and error_of(response)["code"] == code


# --- events ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_emit_refuses_to_run_outside_a_transaction():
    merchant = MerchantFactory(name="Outside")
    with pytest.raises(RuntimeError, match="inside the transaction"):
        emit(merchant, EventType.CUSTOMER_DELETED, {"id": "cus_x", "object": "customer"})
    assert Event.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_an_event_rolls_back_with_the_change_it_reports():
    merchant = MerchantFactory(name="Rollback")
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        emit(merchant, EventType.CUSTOMER_DELETED, {"id": "cus_x", "object": "customer"})
        1 / 0  # noqa: B018
    assert Event.objects.count() == 0


def test_emit_refuses_unknown_types_and_objects_without_an_id(acme):
    with transaction.atomic():
        with pytest.raises(ValueError):
            emit(acme.merchant, "charge.exploded", {"id": "x", "object": "charge"})
        with pytest.raises(ValueError):
            emit(acme.merchant, EventType.CUSTOMER_DELETED, {"object": "customer"})


def test_events_api_serves_the_same_rendering_as_the_webhook_body_and_filters_by_type(acme):
    deleted = EventFactory(
        merchant=acme.merchant, type=EventType.CUSTOMER_DELETED, data={"id": "cus_1", "object": "customer"}
    )
    expired = EventFactory(
        merchant=acme.merchant,
        type=EventType.CHECKOUT_SESSION_EXPIRED,
        data={"id": "cs_1", "object": "checkout.session"},
    )
    one = acme.call("GET", f"/v1/events/{deleted.id}").json()
    deleted.refresh_from_db()
    assert one == render_event(deleted)
    assert one["data"]["object"] == {"id": "cus_1", "object": "customer", "livemode": False}
    assert one["livemode"] is False
    listed = acme.call("GET", "/v1/events?type=checkout.session.expired").json()["data"]
    assert [e["id"] for e in listed] == [expired.id]
    assert acme.call("GET", "/v1/events?type=nope").status_code == 400


def test_deleting_a_customer_emits_customer_deleted_with_ids_only(acme):
    created = acme.call("POST", "/v1/customers", {"email": "p@example.com", "name": "Pat"}).json()
    response = acme.call("DELETE", f"/v1/customers/{created['id']}")
    assert response.json() == {"id": created["id"], "object": "customer", "deleted": True}
    event = Event.objects.get()
    assert event.type == "customer.deleted" and "p@example.com" not in json.dumps(event.data)
    assert not Customer.objects.filter(id=created["id"]).exists()


def test_stored_answers_are_sealed_at_rest_and_replay_in_clear(acme):
    first = acme.call("POST", "/v1/customers", {"email": "sealed@example.com"}, key="seal")
    with connection.cursor() as cursor:
        cursor.execute("SELECT body FROM api_idempotency_records")
        (stored,) = cursor.fetchone()
    assert b"sealed@example.com" not in bytes(stored)
    again = acme.call("POST", "/v1/customers", {"email": "sealed@example.com"}, key="seal")
    assert again.content == first.content


def test_an_answer_no_key_opens_is_a_409_and_the_request_is_not_run_again(acme, settings):
    acme.call("POST", "/v1/customers", {"name": "x"}, key="rotated")
    from cryptography.fernet import Fernet

    settings.VPAY_SECRETS_KEYS = [Fernet.generate_key().decode()]
    again = acme.call("POST", "/v1/customers", {"name": "x"}, key="rotated")
    assert again.status_code == 409 and error_of(again)["code"] == "idempotency_answer_unreadable"
    assert count("customers") == 1
