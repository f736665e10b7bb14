"""Creating payment intents and checkout sessions (web process, one transaction each)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from api.framework import ApiError
from charges import repository
from charges.models import CheckoutSession, PaymentIntent
from charges.rails import configured_rails
from customers.models import Customer
from merchants.models import Merchant
from vpay.tokens import new_token


def validate_payment(merchant: Merchant, fields: dict) -> Customer | None:
    """Refuse what no rail could take, before anything is written: an unknown rail, an
    unsupported currency, a customer that is not this merchant's. Amounts are bounded by
    the body schema (a positive integer of minor units)."""
    if fields["rail"] not in configured_rails():
        raise ApiError(400, "rail_unknown", f"No such rail: {fields['rail']!r}.", param="rail")
    currency = fields["currency"]
    if currency != currency.lower() or currency not in settings.VPAY_CURRENCIES:
        raise ApiError(
            400,
            "currency_unsupported",
            f"Unsupported currency {currency!r}; use one of: {', '.join(settings.VPAY_CURRENCIES)} (lower case).",
            param="currency",
        )
    customer_id = fields.get("customer")
    if customer_id is None:
        return None
    customer = Customer.objects.filter(merchant=merchant, id=customer_id).first()
    if customer is None:
        raise ApiError(400, "resource_missing", f"No such customer: {customer_id!r}.", param="customer")
    return customer


def create_intent(merchant: Merchant, fields: dict) -> PaymentIntent:
    """A ``requires_confirmation`` intent; the customer's ``last_used_at`` moves (SQL clock)."""
    customer = validate_payment(merchant, fields)
    with transaction.atomic():
        intent = PaymentIntent.objects.create(
            merchant=merchant,
            customer=customer,
            amount=fields["amount"],
            currency=fields["currency"],
            rail=fields["rail"],
            metadata=fields.get("metadata", {}),
        )
        repository.touch_customer(customer.id if customer else None)
    intent.refresh_from_db()
    return intent


def create_session(merchant: Merchant, fields: dict) -> CheckoutSession:
    """An intent and an ``open`` session for it; ``expires_at`` is the database's now() + 24 h."""
    with transaction.atomic():
        intent = create_intent(merchant, {k: v for k, v in fields.items() if k not in ("success_url", "cancel_url")})
        session = CheckoutSession.objects.create(
            merchant=merchant,
            intent=intent,
            # The payer's page authenticates with it; shaped so the log redaction catches it.
            client_secret=new_token("cs_secret_", bits=192),
            success_url=fields.get("success_url", ""),
            cancel_url=fields.get("cancel_url", ""),
        )
    session.refresh_from_db()
    return session
