"""charges.inserts: the intent's and the charge's INSERT as one prepared statement each,
against the real database: the row and the instance are what ``objects.create()`` makes,
on the prepared path and on the plain one (a transaction pooler's)."""

from __future__ import annotations

import datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_save, pre_save
from django.test.utils import override_settings

from charges import inserts
from charges.inserts import _SQL, insert_row
from charges.models import Charge, PaymentIntent
from charges.wire import render_intent, render_new_intent
from customers.models import Customer
from tests.factories.merchants import MerchantFactory
from vpay.pipelined import _statement, fetch_prepared

pytestmark = pytest.mark.django_db(transaction=True)


def _prepared_here(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", [_statement(sql)[0].decode()])
        return cursor.fetchone()[0]


def _fields(instance) -> dict:
    """Every column's value but the ones that differ between two rows by nature."""
    return {
        f.attname: getattr(instance, f.attname)
        for f in type(instance)._meta.concrete_fields
        if f.attname not in ("id", "intent_id", "created_at", "updated_at")
    }


def _as_stored(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.parametrize("prepared", [True, False])
def test_the_rows_and_instances_are_what_create_makes(prepared):
    merchant = MerchantFactory()
    customer = Customer.objects.create(merchant=merchant, email="payer@example.com")
    values = {
        "merchant": merchant,
        "customer": customer,
        "amount": 1250,
        "currency": "eur",
        "rail": "sandbox_push",
        "metadata": {"order": "o-1", "nested": {"n": [1, "ü"]}},
        "capture_method": "manual",
    }
    with override_settings(VPAY_DB_PREPARED_STATEMENTS=prepared), transaction.atomic():
        inserted = insert_row(PaymentIntent, **values)
        created = PaymentIntent.objects.create(**values)
        # Rendered as new (no charge looked up), it is what a read of the row renders.
        assert render_new_intent(inserted) == render_intent(PaymentIntent.objects.get(pk=inserted.pk))
        charge_values = {"merchant_id": merchant.id, "rail": "sandbox_push", "flow": "redirect", "amount": 1250}
        charge = insert_row(Charge, intent=inserted, currency="eur", manual_capture=True, **charge_values)
        other_charge = Charge.objects.create(intent=created, currency="eur", manual_capture=True, **charge_values)
    assert inserted.id.startswith("pi_") and charge.id.startswith("ch_")
    assert not inserted._state.adding and inserted._state.db == "default"
    assert inserted.merchant is merchant and charge.intent is inserted  # the related objects given
    # The database's defaults came back with the INSERT, typed as the ORM reads them.
    assert (inserted.status, inserted.amount_received, charge.status, charge.not_found_count) == (
        "requires_confirmation",
        0,
        "submitting",
        0,
    )
    assert isinstance(inserted.created_at, datetime.datetime) and inserted.created_at.tzinfo is not None
    assert _fields(inserted) == _fields(created) and _fields(charge) == _fields(other_charge)
    # What was written is what the instance says.
    assert _as_stored(inserted) == _as_stored(PaymentIntent.objects.get(pk=inserted.pk))
    assert _as_stored(charge) == _as_stored(Charge.objects.get(pk=charge.pk))
    if prepared:
        for sql in _SQL.values():
            assert _prepared_here(sql) == 1


def test_a_value_it_cannot_send_as_a_plain_parameter_is_saved_through_the_orm_as_create_would(monkeypatch):
    prepared_calls = []
    monkeypatch.setattr(inserts, "fetch_prepared", lambda *a, **k: prepared_calls.append(a) or fetch_prepared(*a, **k))
    merchant = MerchantFactory()
    values = {"merchant": merchant, "amount": 700, "currency": "usd", "rail": "sandbox_push"}
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)  # prepares to a datetime
    with transaction.atomic():
        intents = [insert_row(PaymentIntent, **values), PaymentIntent.objects.create(**values)]
        common = {"merchant_id": merchant.id, "rail": "sandbox_push", "flow": "push", "amount": 700, "currency": "usd"}
        before = len(prepared_calls)
        assert before  # the intents went the prepared way
        inserted = insert_row(Charge, intent=intents[0], authorized_at=at, **common)
        assert len(prepared_calls) == before  # saved through the ORM, not the prepared INSERT
        created = Charge.objects.create(intent=intents[1], authorized_at=at, **common)
    assert not inserted._state.adding and inserted.status == "submitting"
    assert _fields(inserted) == _fields(created)
    assert _as_stored(inserted) == _as_stored(Charge.objects.get(pk=inserted.pk))
    assert Charge.objects.get(pk=inserted.pk).authorized_at == at


def test_what_the_orm_would_refuse_or_signal_is_refused_or_has_no_receiver():
    merchant = MerchantFactory()
    unsaved = Customer(merchant=merchant, id=None)  # no primary key yet
    with pytest.raises(ValueError, match="unsaved related object 'customer'"), transaction.atomic():
        insert_row(PaymentIntent, merchant=merchant, customer=unsaved, amount=1, currency="usd", rail="sandbox_push")
    # No signal is sent (as bulk_create sends none): nothing may listen to these two rows.
    for model in (PaymentIntent, Charge):
        assert not pre_save.has_listeners(model) and not post_save.has_listeners(model)


def test_a_refused_row_fails_and_marks_the_transaction_for_rollback():
    merchant = MerchantFactory()
    with transaction.atomic():
        with pytest.raises(IntegrityError, match="amount_positive"):
            insert_row(PaymentIntent, merchant=merchant, amount=0, currency="usd", rail="sandbox_push")
        assert connection.needs_rollback
    assert not PaymentIntent.objects.filter(merchant=merchant).exists()
