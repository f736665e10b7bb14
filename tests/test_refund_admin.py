"""Refunds in the ops console: read-only, unresolved first, filterable, with their rail requests;
and the refund table's named constraints."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.db import IntegrityError, transaction

from charges.models import Charge, PaymentIntent, ProviderRequest, Refund
from merchants.services import create_merchant

pytestmark = pytest.mark.django_db


@pytest.fixture
def charge():
    merchant, _ = create_merchant("Acme")
    intent = PaymentIntent.objects.create(
        merchant=merchant, amount=1000, currency="usd", rail="sandbox_push", status="succeeded"
    )
    return Charge.objects.create(
        intent=intent,
        merchant=merchant,
        rail="sandbox_push",
        flow="push",
        amount=1000,
        currency="usd",
        status="succeeded",
    )


def refund(charge, **kw) -> Refund:
    fields = {"amount": 100, "currency": "usd", "rail": charge.rail, **kw}
    return Refund.objects.create(merchant=charge.merchant, intent=charge.intent, charge=charge, **fields)


def test_the_admin_lists_unresolved_refunds_first_filters_them_and_shows_their_requests(charge, admin_client):
    older = refund(charge, status="unresolved")
    newer = refund(charge, status="succeeded", reason="duplicate")
    ProviderRequest.objects.create(
        charge=charge, refund=older, operation="refund_submit", rail=charge.rail, method="POST", path="/refunds"
    )
    page = admin_client.get("/admin/charges/refund/").content.decode()
    assert page.index(older.id) < page.index(newer.id)  # unresolved first, though older
    filtered = admin_client.get("/admin/charges/refund/?status__exact=succeeded").content.decode()
    assert newer.id in filtered and older.id not in filtered
    assert newer.id in admin_client.get("/admin/charges/refund/?reason__exact=duplicate").content.decode()
    detail = admin_client.get(f"/admin/charges/refund/{quote(older.id)}/change/").content.decode()
    assert "POST /refunds" in detail  # its request, by the operation's label
    assert admin_client.get("/admin/charges/refund/add/").status_code == 403
    assert admin_client.post(f"/admin/charges/refund/{quote(older.id)}/delete/").status_code == 403


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"amount": 0}, "charges_refund_amount_positive"),
        ({"status": "lost"}, "charges_refund_status_known"),
        ({"not_found_count": -1}, "charges_refund_not_found_non_negative"),
    ],
)
def test_the_refund_tables_constraints_hold(charge, fields, constraint):
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        refund(charge, **fields)


@pytest.mark.parametrize(
    ("currency", "amount", "shown", "refunded"),
    [
        ("usd", 1999, "$19.99", "$2.50"),
        ("jpy", 1999, "¥1,999", "¥250"),
        ("bhd", 1999, "BHD\u00a01.999", "BHD\u00a00.250"),
    ],
)
def test_the_admin_shows_amounts_in_their_currency(admin_client, currency, amount, shown, refunded):
    merchant, _ = create_merchant("Acme")
    intent = PaymentIntent.objects.create(
        merchant=merchant,
        amount=amount,
        currency=currency,
        rail="sandbox_push",
        status="succeeded",
        amount_received=amount,
    )
    charge = Charge.objects.create(
        intent=intent, merchant=merchant, rail="sandbox_push", flow="push", amount=amount, currency=currency
    )
    refund(charge, amount=250, currency=currency)
    PaymentIntent.objects.filter(pk=intent.pk).update(amount_refunded=250)
    pages = {
        "paymentintent": [shown, refunded],
        "charge": [shown],
        "refund": [refunded],
    }
    for model, amounts in pages.items():
        listed = admin_client.get(f"/admin/charges/{model}/").content.decode()
        assert all(f">{a}<" in listed for a in amounts), (model, amounts)
    detail = admin_client.get(f"/admin/charges/paymentintent/{quote(intent.id)}/change/").content.decode()
    assert f">{shown}<" in detail and f">{refunded}<" in detail
