"""``/v1/webhook_endpoints``: create (the secret once), list, retrieve, update, delete, rotate;
secrets sealed at rest and redacted from reprs. Through Django's test client, real database."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.api_support import MerchantClient
from tests.factories.webhooks import EndpointFactory
from webhooks import repository, sealing
from webhooks.models import WebhookEndpoint, WebhookSecret

pytestmark = pytest.mark.django_db


def create(api, url="https://hooks.example.com/vpay", events=("*",)):
    response = api.call("POST", "/v1/webhook_endpoints", {"url": url, "enabled_events": list(events)})
    assert response.status_code == 200, response.content
    return response.json()


def test_create_returns_the_secret_once_and_stores_it_sealed(acme):
    created = create(acme, events=["payment_intent.succeeded", "charge.unresolved", "payment_intent.succeeded"])
    secret = created["secret"]
    assert secret.startswith("whsec_")
    assert created["id"].startswith("we_")
    assert created["enabled_events"] == ["payment_intent.succeeded", "charge.unresolved"]  # de-duplicated
    assert created["active_secrets"] == 1
    retrieved = acme.call("GET", f"/v1/webhook_endpoints/{created['id']}").json()
    assert "secret" not in retrieved
    listed = acme.call("GET", "/v1/webhook_endpoints").json()
    assert [e["id"] for e in listed["data"]] == [created["id"]] and "secret" not in listed["data"][0]
    # At rest: no column of any table holds the secret in clear; the sealed value opens to it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM webhook_secrets WHERE sealed LIKE %s", [f"%{secret[6:20]}%"])
        assert cursor.fetchone()[0] == 0
    [sealed] = repository.active_sealed_secrets(created["id"])
    assert sealing.open_sealed(sealed, created["id"]) == secret


def test_reprs_redact_secrets_and_show_a_count(acme):
    created = EndpointFactory(
        merchant=acme.merchant, url="https://hooks.example.com/vpay/tok_path123?auth=tok_query456"
    )
    endpoint = WebhookEndpoint.objects.get(pk=created.pk)
    row = WebhookSecret.objects.get(endpoint=endpoint)
    for text in (repr(endpoint), str(endpoint), repr(row), str(row)):
        assert created.secret not in text and row.sealed not in text
    assert "secrets=<1 redacted>" in repr(endpoint)
    assert "url='https://hooks.example.com'" in repr(endpoint)
    assert "tok_path123" not in repr(endpoint) and "tok_query456" not in repr(endpoint)


def test_rotation_keeps_the_old_secret_signing_for_the_overlap(acme, acme_endpoint):
    rotated = acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret").json()
    assert rotated["secret"] != acme_endpoint.secret and rotated["active_secrets"] == 2
    opened = [sealing.open_sealed(s, acme_endpoint.pk) for s in repository.active_sealed_secrets(acme_endpoint.pk)]
    assert opened == [acme_endpoint.secret, rotated["secret"]]  # configuration order: oldest first
    # The expiry was computed by the database: now() + 24 h by default.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at - created_at > interval '23 hours', expires_at IS NOT NULL FROM webhook_secrets"
            " WHERE endpoint_id = %s ORDER BY id",
            [acme_endpoint.pk],
        )
        assert cursor.fetchall() == [(True, True), (None, False)]
    # A rotation with no overlap retires every older secret at once.
    third = acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret", {"overlap_seconds": 0}).json()
    assert [sealing.open_sealed(s, acme_endpoint.pk) for s in repository.active_sealed_secrets(acme_endpoint.pk)] == [
        third["secret"]
    ]


def test_a_rotation_beyond_the_active_secret_cap_is_refused_and_changes_nothing(acme, acme_endpoint):
    """Rotating again and again inside the overlap must never leave more secrets signing
    than a receiver's verify() accepts (MAX_SIGNATURES): the rotation past the cap is a 409,
    and every secret already handed out keeps signing."""
    from webhooks.services import endpoints
    from webhooks.signing import MAX_SIGNATURES

    assert endpoints.MAX_ACTIVE_SECRETS < MAX_SIGNATURES
    rotate = f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret"
    handed_out = [acme_endpoint.secret]
    for _ in range(endpoints.MAX_ACTIVE_SECRETS - 1):
        answer = acme.call("POST", rotate)
        assert answer.status_code == 200, answer.content
        handed_out.append(answer.json()["secret"])
    sealed_before = repository.active_sealed_secrets(acme_endpoint.pk)
    assert [sealing.open_sealed(s, acme_endpoint.pk) for s in sealed_before] == handed_out

    refused = acme.call("POST", rotate, {"overlap_seconds": 3600})
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "webhook_secrets_at_limit" and "overlap_seconds=0" in error["message"]
    assert not any(secret in refused.content.decode() for secret in handed_out)
    assert repository.active_sealed_secrets(acme_endpoint.pk) == sealed_before
    assert WebhookSecret.objects.filter(endpoint_id=acme_endpoint.pk).count() == endpoints.MAX_ACTIVE_SECRETS

    # Once the oldest has expired (its overlap ran out), rotating works again.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_secrets SET expires_at = now() - interval '1 second'"
            " WHERE id = (SELECT min(id) FROM webhook_secrets WHERE endpoint_id = %s)",
            [acme_endpoint.pk],
        )
    assert acme.call("POST", rotate).status_code == 200
    assert len(repository.active_sealed_secrets(acme_endpoint.pk)) == endpoints.MAX_ACTIVE_SECRETS


def test_a_rotation_with_no_overlap_is_allowed_at_the_cap_and_leaves_one_secret(acme, acme_endpoint):
    """A leaked secret must be replaceable at once, however many are signing."""
    from webhooks.services import endpoints

    for _ in range(endpoints.MAX_ACTIVE_SECRETS - 1):
        endpoints.rotate_secret(WebhookEndpoint.objects.get(pk=acme_endpoint.pk))
    answer = acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret", {"overlap_seconds": 0})
    assert answer.status_code == 200 and answer.json()["active_secrets"] == 1
    assert [sealing.open_sealed(s, acme_endpoint.pk) for s in repository.active_sealed_secrets(acme_endpoint.pk)] == [
        answer.json()["secret"]
    ]


def test_a_rotation_that_lost_the_race_to_a_delete_leaves_no_secret(acme, acme_endpoint):
    from webhooks.services import endpoints

    seen_before_the_delete = WebhookEndpoint.objects.get(pk=acme_endpoint.pk)  # the rotation read it live
    assert acme.call("DELETE", f"/v1/webhook_endpoints/{acme_endpoint.pk}").status_code == 200
    with pytest.raises(endpoints.EndpointDeleted):
        endpoints.rotate_secret(seen_before_the_delete)
    assert not WebhookSecret.objects.filter(endpoint_id=acme_endpoint.pk).exists()
    assert acme.call("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret").status_code == 404


def test_update_and_delete(acme, acme_endpoint):
    updated = acme.call(
        "POST",
        f"/v1/webhook_endpoints/{acme_endpoint.pk}",
        {"enabled_events": ["customer.deleted"], "description": "x"},
    ).json()
    assert updated["enabled_events"] == ["customer.deleted"] and updated["description"] == "x"
    deleted = acme.call("DELETE", f"/v1/webhook_endpoints/{acme_endpoint.pk}").json()
    assert deleted == {"id": acme_endpoint.pk, "object": "webhook_endpoint", "deleted": True}
    assert acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}").status_code == 404
    assert acme.call("GET", "/v1/webhook_endpoints").json()["data"] == []
    # The row stays as evidence for its deliveries; its secrets are gone.
    assert WebhookEndpoint.objects.filter(pk=acme_endpoint.pk, deleted_at__isnull=False).exists()
    assert not WebhookSecret.objects.filter(endpoint_id=acme_endpoint.pk).exists()


def test_a_merchant_sees_only_its_own_endpoints(acme, globex, acme_endpoint):
    for method, path in [
        ("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}"),
        ("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}"),
        ("DELETE", f"/v1/webhook_endpoints/{acme_endpoint.pk}"),
        ("POST", f"/v1/webhook_endpoints/{acme_endpoint.pk}/rotate_secret"),
    ]:
        response = globex.call(method, path, {} if method == "POST" else None)
        assert response.status_code == 404, (method, path)
    assert globex.call("GET", "/v1/webhook_endpoints").json()["data"] == []
    assert acme.call("GET", f"/v1/webhook_endpoints/{acme_endpoint.pk}").status_code == 200


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"enabled_events": ["*"]}, "url", "Missing"),
        ({"url": "https://x.example"}, "enabled_events", "Missing"),
        ({"url": "ftp://x.example/", "enabled_events": ["*"]}, "url", "http or https"),
        ({"url": "https://user:pw@x.example/", "enabled_events": ["*"]}, "url", "credentials"),
        ({"url": "http://169.254.169.254/latest", "enabled_events": ["*"]}, "url", "non-public"),
        ({"url": "http://[::1]:8000/", "enabled_events": ["*"]}, "url", "non-public"),
        ({"url": "not a url", "enabled_events": ["*"]}, "url", "url"),
        ({"url": "https://x.example", "enabled_events": []}, "enabled_events", "at least one"),
        ({"url": "https://x.example", "enabled_events": ["payment.nope"]}, "enabled_events", "unknown event type"),
        ({"url": "https://x.example", "enabled_events": [1]}, "enabled_events", "string"),
        ({"url": "https://x.example", "enabled_events": ["*"], "secret": "mine"}, "secret", "unknown"),
    ],
)
def test_bad_endpoints_are_refused_and_nothing_is_written(acme, body, param, fragment):
    response = acme.call("POST", "/v1/webhook_endpoints", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and fragment.lower() in error["message"].lower()
    assert not WebhookEndpoint.objects.exists() and not WebhookSecret.objects.exists()


def test_a_merchant_at_the_endpoint_cap_is_refused_and_a_deleted_endpoint_frees_a_place(acme, globex):
    from webhooks.services import endpoints

    made = [e.pk for e in EndpointFactory.create_batch(endpoints.MAX_ENDPOINTS, merchant=acme.merchant)]
    refused = acme.call("POST", "/v1/webhook_endpoints", {"url": "https://x.example/", "enabled_events": ["*"]})
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "webhook_endpoint_limit_reached" and str(endpoints.MAX_ENDPOINTS) in error["message"]
    assert WebhookEndpoint.objects.filter(merchant=acme.merchant).count() == endpoints.MAX_ENDPOINTS
    assert WebhookSecret.objects.count() == endpoints.MAX_ENDPOINTS
    create(globex)  # the cap is per merchant
    assert acme.call("DELETE", f"/v1/webhook_endpoints/{made[0]}").status_code == 200
    create(acme)


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_creates_cannot_both_take_the_last_place(settings):
    """The first create's transaction stays open until the second has started: the second
    must wait for it and then count its endpoint, not pass the cap on a stale count."""
    # The first request runs inside this test's open transaction, which would also hold its
    # rate-limit row (a request's own upsert commits at once; nothing in vpay wraps one).
    settings.VPAY_API_RATE_LIMIT = 0
    import threading
    import time

    from django.db import connections, transaction

    from webhooks.services import endpoints

    api = MerchantClient("Racing")
    EndpointFactory.create_batch(endpoints.MAX_ENDPOINTS - 1, merchant=api.merchant)
    written, results = threading.Event(), {}

    def first():
        try:
            with transaction.atomic():
                results["first"] = api.call(
                    "POST", "/v1/webhook_endpoints", {"url": "https://a.example/", "enabled_events": ["*"]}
                )
                written.set()
                time.sleep(1.0)  # the second create is now waiting, or counting
        finally:
            connections.close_all()

    holder = threading.Thread(target=first)
    holder.start()
    assert written.wait(10)
    # The merchant's other writes do not queue behind the lock (their foreign-key check
    # takes a key-share lock, which FOR NO KEY UPDATE lets through).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '300ms'")
        assert api.call("POST", "/v1/customers", {"name": "not blocked"}).status_code == 200
    results["second"] = api.call(
        "POST", "/v1/webhook_endpoints", {"url": "https://b.example/", "enabled_events": ["*"]}
    )
    holder.join(20)
    assert results["first"].status_code == 200, results["first"].content
    assert results["second"].status_code == 409, results["second"].content
    assert WebhookEndpoint.objects.filter(merchant=api.merchant).count() == endpoints.MAX_ENDPOINTS


def test_live_mode_requires_https(acme, settings):
    acme.go_live(settings)
    response = acme.call("POST", "/v1/webhook_endpoints", {"url": "http://hooks.example.com/", "enabled_events": ["*"]})
    assert response.status_code == 400 and "https" in response.json()["error"]["message"]
    assert create(acme, url="https://hooks.example.com/")["url"] == "https://hooks.example.com/"


def test_an_idempotent_create_replays_the_secret_without_storing_it_in_clear(acme):
    body = json.dumps({"url": "https://hooks.example.com/vpay", "enabled_events": ["*"]})

    def post():
        return acme.client.generic(
            "POST",
            "/v1/webhook_endpoints",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {acme.key}",
            HTTP_IDEMPOTENCY_KEY="create-endpoint-1",
        )

    first, replay = post(), post()
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content  # the client that lost the first answer still gets its secret
    secret = first.json()["secret"]
    assert WebhookEndpoint.objects.count() == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT body FROM api_idempotency_records")
        [(stored,)] = cursor.fetchall()
    assert secret.encode() not in bytes(stored) and b"whsec_" not in bytes(stored)
