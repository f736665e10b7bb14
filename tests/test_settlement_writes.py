"""The settlement's one statement (charges.settlement_writes._SETTLE) returns what its event
renders: the same intent, charge and checkout session a read after the writes returns
(repository.for_event), against the real database."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from charges import repository, settlement_writes
from charges.models import Charge, CheckoutSession, PaymentIntent
from charges.states import ChargeStatus, IntentStatus
from charges.wire import render_intent, render_session
from tests.factories.merchants import MerchantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def a_submitted_charge(*, intent_status: str = "processing", session: bool = False) -> Charge:
    merchant = MerchantFactory()
    intent = PaymentIntent.objects.create(
        merchant=merchant, amount=5000, currency="usd", rail="sandbox_push", status=intent_status
    )
    if session:
        CheckoutSession.objects.create(merchant=merchant, intent=intent, client_secret="cs_x_secret_y")
    return Charge.objects.create(
        intent=intent, merchant=merchant, rail="sandbox_push", flow="push", amount=5000, currency="usd",
        status="submitted", pay_token="tok_1",
    )  # fmt: skip


def settle(charge: Charge, status=ChargeStatus.SUCCEEDED, intent_status=IntentStatus.SUCCEEDED, **kw):
    with transaction.atomic():
        settled = settlement_writes.settle_charge_and_intent(charge.id, status, intent_status, **kw)
        read_back = repository.for_event(charge.intent_id)
    return settled, read_back


def same(settled, read_back) -> None:
    (intent, session), (read_intent, read_session) = settled, read_back
    assert render_intent(intent, for_event=True) == render_intent(read_intent, for_event=True)
    assert render_intent(intent) == render_intent(read_intent)  # the charge's sealed pay_token and URL too
    assert (session and render_session(session)) == (read_session and render_session(read_session))


@pytest.mark.parametrize("session", [False, True])
def test_a_success_returns_the_rows_a_read_after_it_returns(session):
    charge = a_submitted_charge(session=session)
    settled, read_back = settle(charge)
    assert settled is not None and settled[0].status == "succeeded" and settled[0].charge.amount_captured == 5000
    same(settled, read_back)


def test_a_failure_returns_the_rows_a_read_after_it_returns():
    charge = a_submitted_charge()
    settled, read_back = settle(charge, ChargeStatus.FAILED, IntentStatus.FAILED, failure_code="declined")
    assert settled is not None and settled[0].charge.failure_code == "declined"
    same(settled, read_back)


def test_an_intent_the_statement_did_not_move_is_returned_as_it_stands():
    charge = a_submitted_charge(intent_status="canceled")
    settled, read_back = settle(charge)
    assert settled is not None and settled[0].status == "canceled" and settled[0].charge.status == "succeeded"
    same(settled, read_back)


def test_a_charge_that_did_not_move_returns_nothing():
    charge = a_submitted_charge()
    Charge.objects.filter(pk=charge.pk).update(status="failed")
    assert settle(charge)[0] is None


def test_an_intent_moved_while_the_statement_waited_for_it_is_returned_as_it_now_stands():
    """Another transaction moves the intent out of the open states while the settlement's
    update of it waits for the row: the update matches nothing, and the intent returned is the
    one committed, not the one the statement's snapshot saw."""
    charge = a_submitted_charge()
    locked = threading.Event()

    def an_operator_cancels_it():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE payment_intents SET status = 'canceled' WHERE id = %s", [charge.intent_id])
                locked.set()
                time.sleep(0.5)  # the settlement's statement waits for this row meanwhile
        finally:
            connection.close()

    other = threading.Thread(target=an_operator_cancels_it)
    other.start()
    assert locked.wait(5)
    settled, read_back = settle(charge)
    other.join(5)
    assert settled is not None and settled[0].status == "canceled"
    same(settled, read_back)
