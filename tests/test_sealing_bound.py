"""Sealed values are bound to their row: a sealed value copied into another row, another
column or another table does not open there (AES-GCM with the table, the column and the
row's identity as associated data). Values sealed by the earlier Fernet format still open
until ``manage.py reseal`` rewrites them."""

from __future__ import annotations

import io
import ipaddress

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from api import idempotency
from charges.models import Charge, CheckoutSession
from charges.repository import read_for_poll
from merchants.services import create_merchant
from tests.charges_support import FAST_POLICY, Merchant, apply_policy, sql, use_rails
from tests.test_webhook_fast_path import attempt, one_delivery
from vpay import sealing
from webhooks import sealing as webhook_sealing
from webhooks.models import AttemptState
from webhooks.repository import active_sealed_secrets
from webhooks.services.endpoints import create_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme(settings, tmp_path, sandbox_rail):
    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_CONFIRM_GRACE_SECONDS": 30.0})
    use_rails(settings, tmp_path, sandbox_rail.rails())
    return Merchant("Acme")


def _session(merchant: Merchant) -> str:
    response = merchant.call(
        "POST", "/v1/checkout/sessions", {"amount": 500, "currency": "usd", "rail": "sandbox_push"}
    )
    assert response.status_code == 200, response.content
    return response.json()["id"]


def test_a_client_secret_copied_into_another_sessions_row_does_not_open(acme):
    a, b = _session(acme), _session(acme)
    sql(
        "UPDATE checkout_sessions SET client_secret = (SELECT client_secret FROM checkout_sessions WHERE id = %s)"
        " WHERE id = %s",
        [a, b],
    )
    assert CheckoutSession.objects.get(pk=a).client_secret.startswith("cs_secret_")
    with pytest.raises(sealing.Unreadable) as info:
        CheckoutSession.objects.get(pk=b).client_secret  # noqa: B018 - reading it is the test
    assert "cs_secret" not in str(info.value)


def test_a_pay_token_moved_to_another_column_or_table_does_not_open(acme):
    intent = acme.confirm(acme.intent(rail="sandbox_redirect")["id"])
    charge_id, session = intent["charge"]["id"], _session(acme)
    assert read_for_poll(charge_id).pay_token
    # The redirect URL's sealed text put in the pay_token column of the same row.
    sql("UPDATE charges SET pay_token = redirect_url WHERE id = %s", [charge_id])
    with pytest.raises(sealing.Unreadable):
        read_for_poll(charge_id)
    with pytest.raises(sealing.Unreadable):
        Charge.objects.get(pk=charge_id).pay_token  # noqa: B018
    # A session's client secret put in the charge's redirect_url column (another table).
    sql(
        "UPDATE charges SET redirect_url = (SELECT client_secret FROM checkout_sessions WHERE id = %s) WHERE id = %s",
        [session, charge_id],
    )
    with pytest.raises(sealing.Unreadable):
        Charge.objects.get(pk=charge_id).redirect_url  # noqa: B018


def test_a_stored_answer_copied_to_another_merchants_record_does_not_replay():
    a, b = create_merchant("A")[0].pk, create_merchant("B")[0].pk
    hashed = idempotency.request_hash("POST", "/v1/x", b"{}")
    assert idempotency.store(a, "k1", hashed, 200, b'{"secret": "whsec_of_a"}')
    assert idempotency.store(b, "k1", hashed, 200, b'{"secret": "whsec_of_b"}')
    assert idempotency.store(b, "k2", hashed, 200, b'{"secret": "whsec_of_b2"}')
    # Merchant A's answer under merchant B's record (same key), then another key's answer.
    for source in [(a, "k1"), (b, "k2")]:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE api_idempotency_records SET body = (SELECT body FROM api_idempotency_records"
                " WHERE merchant_id = %s AND key = %s) WHERE merchant_id = %s AND key = 'k1'",
                [*source, b],
            )
        with pytest.raises(idempotency.AnswerUnreadable):
            idempotency.lookup(b, "k1")
    assert idempotency.lookup(a, "k1").body == b'{"secret": "whsec_of_a"}'


def _fernet(settings, value: bytes) -> bytes:
    # A value as the earlier, unbound format sealed it.
    return Fernet(settings.VPAY_SECRETS_KEYS[0]).encrypt(value)


def test_values_sealed_before_binding_open_and_reseal_binds_them(acme, settings):
    session = _session(acme)
    secret = CheckoutSession.objects.get(pk=session).client_secret
    hashed = idempotency.request_hash("POST", "/v1/x", b"{}")
    assert idempotency.store(acme.merchant.pk, "k1", hashed, 200, b'{"a": 1}')
    endpoint, whsec = create_endpoint(acme.merchant, url="https://hooks.example.com/h", enabled_events=["*"])
    sql(
        "UPDATE checkout_sessions SET client_secret = %s WHERE id = %s",
        [_fernet(settings, secret.encode()).decode(), session],
    )
    sql("UPDATE api_idempotency_records SET body = %s WHERE key = 'k1'", [_fernet(settings, b'{"a": 1}')])
    sql(
        "UPDATE webhook_secrets SET sealed = %s WHERE endpoint_id = %s",
        [_fernet(settings, whsec.encode()).decode(), endpoint.pk],
    )
    # Read old format: everything still opens.
    assert CheckoutSession.objects.get(pk=session).client_secret == secret
    assert idempotency.lookup(acme.merchant.pk, "k1").body == b'{"a": 1}'
    [sealed] = active_sealed_secrets(endpoint.pk)
    assert webhook_sealing.open_sealed(sealed, endpoint.pk) == whsec

    out = io.StringIO()
    call_command("reseal", "--fernet-only", stdout=out)
    assert "checkout_sessions.client_secret: 1 re-sealed, 0 unreadable" in out.getvalue()
    assert "api_idempotency_records.body: 1 re-sealed" in out.getvalue()
    assert "webhook_secrets.sealed: 1 re-sealed" in out.getvalue()
    assert secret not in out.getvalue() and whsec not in out.getvalue()
    stored = [
        sql("SELECT client_secret FROM checkout_sessions WHERE id = %s", [session])[0][0].encode(),
        bytes(sql("SELECT body FROM api_idempotency_records WHERE key = 'k1'")[0][0]),
        active_sealed_secrets(endpoint.pk)[0].encode(),
    ]
    assert all(value.startswith(sealing.PREFIX) for value in stored)
    settings.VPAY_SEALED_READ_FERNET = False  # once re-sealed, the unbound format can be refused
    assert CheckoutSession.objects.get(pk=session).client_secret == secret
    assert idempotency.lookup(acme.merchant.pk, "k1").body == b'{"a": 1}'
    assert webhook_sealing.open_sealed(active_sealed_secrets(endpoint.pk)[0], endpoint.pk) == whsec
    sql(
        "UPDATE checkout_sessions SET client_secret = %s WHERE id = %s",
        [_fernet(settings, b"cs_secret_x").decode(), session],
    )
    with pytest.raises(sealing.Unreadable):
        CheckoutSession.objects.get(pk=session).client_secret  # noqa: B018


def test_key_rotation_reseal_moves_every_value_to_the_new_key(acme, settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.VPAY_SECRETS_KEYS = [old]
    session = _session(acme)
    secret = CheckoutSession.objects.get(pk=session).client_secret
    settings.VPAY_SECRETS_KEYS = [new, old]
    assert CheckoutSession.objects.get(pk=session).client_secret == secret  # any configured key opens
    out = io.StringIO()
    call_command("reseal", stdout=out)
    assert "checkout_sessions.client_secret: 1 re-sealed, 0 unreadable" in out.getvalue()
    settings.VPAY_SECRETS_KEYS = [new]
    assert CheckoutSession.objects.get(pk=session).client_secret == secret
    # A value moved from another row is counted and left alone, never re-sealed for its new row.
    other = _session(acme)
    sql(
        "UPDATE checkout_sessions SET client_secret = (SELECT client_secret FROM checkout_sessions WHERE id = %s)"
        " WHERE id = %s",
        [session, other],
    )
    err = io.StringIO()
    call_command("reseal", stdout=io.StringIO(), stderr=err)
    assert "1 values open with no configured key" in err.getvalue()
    with pytest.raises(sealing.Unreadable):
        CheckoutSession.objects.get(pk=other).client_secret  # noqa: B018


def test_a_webhook_secret_copied_to_another_endpoint_does_not_sign_there(receiver, settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = (ipaddress.ip_network("127.0.0.1/32"),)
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = (0.0, 0.0, 0.0)
    settings.VPAY_WEBHOOK_TIMEOUT = 2.0
    a, secret_a, _ = one_delivery(receiver, "/hooks/a?mode=status&status=500")
    b, _, to_b = one_delivery(receiver, "/hooks/b?mode=status&status=500")
    receiver.add_secrets(secret_a)
    sql(
        "UPDATE webhook_secrets SET sealed = (SELECT sealed FROM webhook_secrets WHERE endpoint_id = %s)"
        " WHERE endpoint_id = %s",
        [a.pk, b.pk],
    )
    attempted = attempt(to_b.pk)
    assert attempted.attempt_state == AttemptState.FAILED and "no usable signing secret" in attempted.error
    assert receiver.received("/hooks/b") == []  # never signed with another endpoint's secret
