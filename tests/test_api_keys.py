"""Secret keys: roll with an overlap and revoke (services, the shell, the admin), the
test/live key distinction, and ``livemode`` on every object and event."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.test import Client

from merchants import credentials
from merchants.credentials import Kind, classify
from merchants.models import ApiKey, OAuthClient
from merchants.services import api_key_revoke, api_key_roll, merchant_create
from tests.charges_support import scalar, sql
from tests.conftest import wait_for
from vpay.errors import AuthenticationFailed, InvalidInput, InvalidState
from webhooks.event_types import EventType
from webhooks.events import emit, render_event

pytestmark = pytest.mark.django_db


def status(key: str) -> int:
    return Client().get("/v1/customers", HTTP_AUTHORIZATION=f"Bearer {key}").status_code


# --- the credential decision table ---------------------------------------------------------

HEADERS = ["", "Bearer", "Basic sk_test_abc", "Bearer pk_test_x", "bearer sk_test_abc", "Bearer  sk_live_abc "]
HEADERS += [f"Bearer {p}abc" for by_mode in credentials.PREFIXES.values() for p in by_mode.values()]


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(("header", "live_mode"), list(itertools.product(HEADERS, [False, True])))
def test_the_credential_table(header, live_mode):
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    expected_prefixes = {kind: by_mode[live_mode] for kind, by_mode in credentials.PREFIXES.items()}
    other_prefixes = {kind: by_mode[not live_mode] for kind, by_mode in credentials.PREFIXES.items()}
    try:
        got = classify(header, live_mode=live_mode)
    except AuthenticationFailed as exc:
        got = exc.code
    if not header:
        assert got == "api_key_missing"
    elif scheme.lower() != "bearer" or not credential:
        assert got == "api_key_invalid"
    elif any(credential.startswith(p) for p in expected_prefixes.values()):
        kind = next(k for k, p in expected_prefixes.items() if credential.startswith(p))
        assert got == (kind, credential)
    elif any(credential.startswith(p) for p in other_prefixes.values()):
        assert got == "livemode_mismatch"  # a test credential in live mode, or a live one outside it
    else:
        assert got == "api_key_invalid"


def test_a_test_key_does_not_authenticate_in_live_mode_and_says_why(settings):
    _, test_key = merchant_create(name="Acme")
    settings.LIVE_MODE = True
    response = Client().get("/v1/customers", HTTP_AUTHORIZATION=f"Bearer {test_key}")
    assert response.status_code == 401 and response.json()["error"]["code"] == "livemode_mismatch"
    _, live_key = merchant_create(name="Live")
    assert live_key.startswith("sk_live_") and status(live_key) == 200
    settings.LIVE_MODE = False
    assert status(live_key) == 401 and status(test_key) == 200


# --- roll and revoke ---------------------------------------------------------------------


def test_a_roll_keeps_the_old_key_working_for_the_overlap_then_stops_it_on_the_database_clock():
    merchant, old = merchant_create(name="Acme")
    new_row, new = api_key_roll(merchant_id=merchant.id, overlap_seconds=1, reason="yearly rotation")
    assert new != old and new_row.last4 == new[-4:]
    assert (status(old), status(new)) == (200, 200)
    # statement_timestamp(), as Django's Now() reads it: now() stands still in the test's transaction.
    ends = scalar(
        "SELECT expires_at - statement_timestamp() FROM merchant_api_keys WHERE digest = %s", [credentials.digest(old)]
    )
    assert 0 < ends.total_seconds() <= 1
    wait_for(
        lambda: scalar(
            "SELECT bool_and(expires_at <= statement_timestamp()) FROM merchant_api_keys WHERE expires_at IS NOT NULL"
        )
    )
    assert (status(old), status(new)) == (401, 200)


def test_an_overlap_of_zero_stops_the_old_keys_at_once_and_a_roll_never_extends_a_key():
    merchant, first = merchant_create(name="Acme")
    _, second = api_key_roll(merchant_id=merchant.id, overlap_seconds=60, reason="a")
    _, third = api_key_roll(merchant_id=merchant.id, overlap_seconds=3600, reason="b")
    # The first key keeps its 60 s end; the second gets 3600 s.
    ends = dict(sql("SELECT last4, extract(epoch FROM expires_at - statement_timestamp()) FROM merchant_api_keys"))
    assert 0 < ends[first[-4:]] <= 60 and 60 < ends[second[-4:]] <= 3600 and ends[third[-4:]] is None
    api_key_roll(merchant_id=merchant.id, overlap_seconds=0, reason="leaked")
    assert [status(k) for k in (first, second, third)] == [401, 401, 401]


def test_a_revoked_key_stops_at_once_with_its_reason_and_is_not_revoked_twice():
    _, key = merchant_create(name="Acme")
    row = ApiKey.objects.get()
    with pytest.raises(InvalidInput):
        api_key_revoke(key_id=row.pk, reason="   ")
    assert status(key) == 200
    revoked = api_key_revoke(key_id=row.pk, reason="pasted in a ticket")
    assert revoked.revoked_reason == "pasted in a ticket" and status(key) == 401
    with pytest.raises(InvalidState):
        api_key_revoke(key_id=row.pk, reason="again")
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiKey.objects.filter(pk=row.pk).update(revoked_reason="")  # merchant_api_keys_revoked_with_reason


def test_the_apikeys_command_rolls_lists_and_revokes(capsys):
    merchant, old = merchant_create(name="Acme")
    call_command("apikeys", "roll", merchant.id, "--reason", "rotation", "--overlap", "600")
    out, err = capsys.readouterr()
    new = out.strip()
    assert new.startswith("sk_test_") and new not in err and "600 s" in err
    call_command("apikeys", "list", merchant.id)
    listing = capsys.readouterr().out
    assert f"sk_…{old[-4:]}\tactive until" in listing and f"sk_…{new[-4:]}\tactive\t" in listing
    assert old not in listing and new not in listing
    old_id = ApiKey.objects.get(last4=old[-4:]).pk
    call_command("apikeys", "revoke", str(old_id), "--reason", "done")
    assert status(old) == 401 and status(new) == 200
    with pytest.raises(CommandError, match="already revoked"):
        call_command("apikeys", "revoke", str(old_id), "--reason", "done")
    with pytest.raises(CommandError, match="No such merchant"):
        call_command("apikeys", "roll", "acct_nobody", "--reason", "x")


# --- the admin ---------------------------------------------------------------------------


@pytest.fixture
def admin_client():
    user = User.objects.create_superuser("ops", "ops@example.com", "pw-ops-123")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_rolls_a_key_in_two_steps_with_a_reason_and_shows_the_new_key_once(admin_client):
    merchant, old = merchant_create(name="Acme")
    url = "/admin/merchants/merchant/"
    post = {"action": "roll_secret_key", "_selected_action": [merchant.id]}
    form = admin_client.post(url, post)
    assert form.status_code == 200 and b'name="reason"' in form.content and ApiKey.objects.count() == 1
    blank = admin_client.post(url, {**post, "post": "yes", "reason": " ", "overlap": "60"})
    assert blank.status_code == 400 and ApiKey.objects.count() == 1
    done = admin_client.post(url, {**post, "post": "yes", "reason": "rotation", "overlap": "60"})
    new = ApiKey.objects.exclude(last4=old[-4:]).get()
    page = done.content.decode()
    assert done.status_code == 200 and "sk_test_" in page and new.last4 in page
    assert (status(old), ApiKey.objects.get(last4=old[-4:]).expires_at is not None) == (200, True)
    history = LogEntry.objects.get(object_id=merchant.id).change_message
    assert "rotation" in history and "sk_test_" not in history.replace("sk_…", "")


def test_the_admin_revokes_keys_and_clients_with_a_reason(admin_client):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    merchant, key = merchant_create(name="Acme")
    row = ApiKey.objects.get()
    url = "/admin/merchants/apikey/"
    post = {"action": "revoke_selected", "_selected_action": [row.pk]}
    assert admin_client.post(url, post).status_code == 200 and status(key) == 200
    admin_client.post(url, {**post, "post": "yes", "reason": "compromised"})
    assert status(key) == 401 and ApiKey.objects.get().revoked_reason == "compromised"

    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    secret = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    add = "/admin/merchants/oauthclient/add/"
    refused = admin_client.post(add, {"merchant": merchant.id, "name": "Backend", "public_key": secret})
    assert refused.status_code == 200 and "private key" in refused.content.decode() and not OAuthClient.objects.exists()
    assert secret not in refused.content.decode()
    admin_client.post(add, {"merchant": merchant.id, "name": "Backend", "public_key": pem.decode()})
    client = OAuthClient.objects.get()
    clients_url = "/admin/merchants/oauthclient/"
    admin_client.post(
        clients_url, {"action": "revoke_selected", "_selected_action": [client.id], "post": "yes", "reason": "retired"}
    )
    client.refresh_from_db()
    assert client.revoked_at is not None and client.revoked_reason == "retired"


# --- livemode ------------------------------------------------------------------------------


def test_every_object_and_event_carries_livemode(settings):
    merchant, key = merchant_create(name="Acme")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    customer = client.post("/v1/customers", {"name": "Pat"}, content_type="application/json").json()
    listed = client.get("/v1/customers").json()
    assert customer["livemode"] is False and "livemode" not in listed and listed["data"][0]["livemode"] is False
    with transaction.atomic():
        event = emit(merchant, EventType.CUSTOMER_DELETED, {"id": "cus_1", "object": "customer", "deleted": True})
        nested = emit(merchant, EventType.CHECKOUT_SESSION_EXPIRED, {"id": "cs_1", "object": "checkout.session"})
    assert "livemode" not in event.data  # a deleted object is its id alone
    body = render_event(nested)
    assert body["livemode"] is False and body["data"]["object"]["livemode"] is False
    # The event keeps the mode it was written in: its signed body never changes.
    settings.LIVE_MODE = True
    assert render_event(nested) == body
    _, live_key = merchant_create(name="Live")
    live = Client(HTTP_AUTHORIZATION=f"Bearer {live_key}").post(
        "/v1/customers", {"name": "Lee"}, content_type="application/json"
    )
    assert live.json()["livemode"] is True


def test_kind_prefixes_are_what_the_redaction_matches():
    from vpay.logging import redact

    for kind in Kind:
        for live_mode in (False, True):
            token = credentials.prefix(kind, live_mode=live_mode) + "A1b2C3d4E5f6G7h8"
            assert token not in redact(f"leaked {token} here")
