"""Payment intents, their charges and refunds (``tests/factories/__init__.py`` says how every
factory is made). Production refuses a rail it has not configured, and so do these: a test
configures the rails first (the ``rails`` fixture, or ``tests.charges_support.use_rails``).

* ``IntentFactory()``: ``requires_confirmation``, as ``create_intent`` writes it (1000 usd on
  ``sandbox_push``, for a new merchant); ``IntentFactory(paid=True)`` is then confirmed on its
  rail and its charge settled ``succeeded`` as the poll settles it (``transitions.succeed``,
  with its event), without a worker: the rail itself still holds the charge pending.
* ``ChargeFactory()``: its intent confirmed by ``confirm_intent`` (the rail called over HTTP),
  the charge as the rail's answer left it. ``ChargeFactory(crashed_before_the_post=True)``
  is what a crash right after the confirm's first commit leaves: intent ``processing``,
  charge ``submitting``, its poll job due now, no request row at all.
* ``RefundFactory()``: accepted by ``refund_create`` (``submitting``, its poll job queued) on
  a paid intent; ``amount=None`` refunds all that is left.
"""

from __future__ import annotations

import factory
from django.db import transaction

from charges import repository
from charges.models import Charge, PaymentIntent, Refund
from charges.rails import get_rail
from charges.services import transitions
from charges.services.confirm import confirm_intent, open_charge
from charges.services.intents import create_intent
from charges.services.refunds import refund_create
from tests.factories.merchants import MerchantFactory


class IntentFactory(factory.Factory):
    class Meta:
        model = PaymentIntent

    merchant = factory.SubFactory(MerchantFactory)
    amount = 1000
    currency = "usd"
    rail = "sandbox_push"
    metadata = factory.Dict({})
    paid = False

    @classmethod
    def _create(cls, model_class, merchant, paid: bool, **fields) -> PaymentIntent:
        intent = create_intent(merchant, fields)
        if paid:
            charge = ChargeFactory(intent=intent)
            if not transitions.succeed(repository.read_for_poll(charge.id)):
                raise AssertionError(f"{charge!r} did not settle: the rail refused its submit?")
            intent.refresh_from_db()
        return intent


class ChargeFactory(factory.Factory):
    class Meta:
        model = Charge

    intent = factory.SubFactory(IntentFactory)
    crashed_before_the_post = False

    @classmethod
    def _create(cls, model_class, intent: PaymentIntent, crashed_before_the_post: bool) -> Charge:
        if crashed_before_the_post:
            return _first_commit_of_a_confirm(intent)
        return confirm_intent(intent.merchant, intent.id).charge


def _first_commit_of_a_confirm(intent: PaymentIntent) -> Charge:
    """``confirm_intent``'s first transaction alone (``open_charge``), its poll job due now
    instead of after the grace: the one crash point no live process can be stopped in on demand."""
    with transaction.atomic():
        charge = open_charge(intent, get_rail(intent.rail), poll_delay=0)
    charge.refresh_from_db()
    return charge


class RefundFactory(factory.Factory):
    class Meta:
        model = Refund

    intent = factory.SubFactory(IntentFactory, paid=True)
    amount = None
    reason = None

    @classmethod
    def _create(cls, model_class, intent: PaymentIntent, **fields) -> Refund:
        return refund_create(merchant=intent.merchant, payment_intent=intent.id, **fields)
