"""The charges tables' own invariants: named constraints provoked, defaults from the database clock."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.db import IntegrityError, connection, transaction

from charges.models import Charge, CheckoutSession, PaymentIntent, ProviderRequest
from charges.states import ChargeStatus, CheckoutPaymentStatus, CheckoutSessionStatus, IntentStatus
from merchants.services import create_merchant

pytestmark = pytest.mark.django_db


@pytest.fixture
def merchant():
    return create_merchant("Models Ltd")[0]


def intent(merchant, **kw) -> PaymentIntent:
    return PaymentIntent.objects.create(
        merchant=merchant, amount=kw.pop("amount", 100), currency="usd", rail="sandbox_push", **kw
    )


def violates(name: str, fn) -> None:
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        fn()
    assert name in str(caught.value)


def test_defaults_are_the_start_states(merchant):
    pi = intent(merchant)
    pi.refresh_from_db()
    assert pi.status == IntentStatus.REQUIRES_CONFIRMATION
    ch = Charge.objects.create(
        intent=pi, merchant=merchant, rail="sandbox_push", flow="push", amount=100, currency="usd"
    )
    ch.refresh_from_db()
    assert ch.status == ChargeStatus.SUBMITTING and ch.not_found_count == 0


def test_named_constraints_hold(merchant):
    violates("charges_paymentintent_amount_positive", lambda: intent(merchant, amount=0))
    violates("charges_paymentintent_status_known", lambda: intent(merchant, status="bogus"))
    pi = intent(merchant)
    violates(
        "charges_charge_flow_known",
        lambda: Charge.objects.create(intent=pi, merchant=merchant, rail="r", flow="pull", amount=1, currency="usd"),
    )
    violates(
        "charges_charge_status_known",
        lambda: Charge.objects.create(
            intent=pi, merchant=merchant, rail="r", flow="push", amount=1, currency="usd", status="x"
        ),
    )


def test_one_charge_per_intent_is_a_database_fact(merchant):
    pi = intent(merchant)
    Charge.objects.create(intent=pi, merchant=merchant, rail="r", flow="push", amount=1, currency="usd")
    violates(
        "intent_id",
        lambda: Charge.objects.create(intent=pi, merchant=merchant, rail="r", flow="push", amount=1, currency="usd"),
    )


def test_provider_request_excerpts_are_bounded(merchant):
    pi = intent(merchant)
    ch = Charge.objects.create(intent=pi, merchant=merchant, rail="r", flow="push", amount=1, currency="usd")
    violates(
        "charges_providerrequest_excerpts_bounded",
        lambda: ProviderRequest.objects.create(
            charge=ch, operation="submit", rail="r", method="POST", path="/charges", response_excerpt="x" * 1001
        ),
    )
    row = ProviderRequest.objects.create(charge=ch, operation="status", rail="r", method="GET", path="/charges/x")
    row.refresh_from_db()
    assert row.status_code is None and row.sent_at is not None  # sent, no answer


def test_a_checkout_session_expires_24_hours_after_the_database_created_it(merchant):
    session = CheckoutSession.objects.create(merchant=merchant, intent=intent(merchant), client_secret="cs_x_secret_y")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT expires_at - created_at, status, payment_status FROM checkout_sessions WHERE id = %s", [session.id]
        )
        lifetime, status, payment_status = cursor.fetchone()
    assert lifetime.total_seconds() == 24 * 3600
    assert (status, payment_status) == (CheckoutSessionStatus.OPEN, CheckoutPaymentStatus.UNPAID)
    assert "secret" not in repr(session)


@pytest.mark.django_db(transaction=True)
def test_the_retention_sweep_keeps_a_customer_with_a_payment_in_flight_and_unlinks_finished_ones(merchant):
    from customers.models import Customer
    from customers.retention import erase_if_idle

    busy = Customer.objects.create(merchant=merchant)
    done = Customer.objects.create(merchant=merchant)
    in_flight = intent(merchant, customer=busy, status="processing")
    finished = intent(merchant, customer=done, status="succeeded")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE customers SET last_used_at = now() - interval '400 days'")
    assert erase_if_idle(busy.id) is False
    assert erase_if_idle(done.id) is True
    finished.refresh_from_db()
    in_flight.refresh_from_db()
    assert finished.customer_id is None and in_flight.customer_id == busy.id


def test_the_admin_lists_unresolved_charges_first_and_never_shows_the_pay_token(merchant, admin_client):
    older = Charge.objects.create(
        intent=intent(merchant),
        merchant=merchant,
        rail="r",
        flow="redirect",
        amount=1,
        currency="usd",
        status="unresolved",
        pay_token="tok_secret_value",
    )
    newer = Charge.objects.create(
        intent=intent(merchant), merchant=merchant, rail="r", flow="push", amount=1, currency="usd"
    )
    page = admin_client.get("/admin/charges/charge/").content.decode()
    assert page.index(older.id) < page.index(newer.id)  # unresolved first, though older
    detail = admin_client.get(f"/admin/charges/charge/{quote(older.id)}/change/").content.decode()
    assert detail.count(older.id) >= 1 and "tok_secret_value" not in detail
