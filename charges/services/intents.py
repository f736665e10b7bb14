"""Creating payment intents and checkout sessions (web process, one transaction each)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from charges import money, repository
from charges.inserts import insert_row
from charges.models import CheckoutSession, PaymentIntent
from charges.rails import configured_rails
from charges.states import CaptureMethod
from charges.wire import render_new_intent
from customers.models import Customer
from merchants.models import Merchant
from vpay.errors import InvalidInput
from vpay.tokens import new_token
from webhooks.event_types import EventType
from webhooks.events import emit


def validate_payment(merchant: Merchant, fields: dict) -> Customer | None:
    """Refuse what no rail could take, before anything is written: an unknown rail, an
    unsupported currency, an amount outside the currency's bounds (charges/money.py), a
    customer that is not this merchant's."""
    if fields["rail"] not in configured_rails():
        raise InvalidInput("rail_unknown", f"No such rail: {fields['rail']!r}.", param="rail")
    currency = fields["currency"]
    if not money.is_accepted(currency):
        raise InvalidInput(
            "currency_unsupported",
            f"Unsupported currency {currency!r}; use one of: {', '.join(money.accepted_currencies())} (lower case).",
            param="currency",
        )
    money.refuse_out_of_bounds(fields["amount"], currency)
    customer_id = fields.get("customer")
    if customer_id is None:
        return None
    customer = Customer.objects.filter(merchant=merchant, id=customer_id).first()
    if customer is None:
        raise InvalidInput("resource_missing", f"No such customer: {customer_id!r}.", param="customer")
    return customer


MAX_RETURN_URL = 2000  # CheckoutSession.success_url / cancel_url


def clean_return_url(url: str) -> str:
    """A ``success_url`` / ``cancel_url`` the payer's browser may be sent to, or ValueError
    saying why (never echoing the URL: it may carry credentials).

    An absolute http or https URL (https only in live mode) with a host and no
    ``user:password@``. Whitespace, control characters and backslashes are refused rather
    than cleaned: browsers drop tabs and newlines and read a backslash as a slash, so the
    URL they would follow is not the one judged here (a tab inside ``javascript:``).
    """
    if not url:
        raise ValueError("must be an http or https URL.")
    if len(url) > MAX_RETURN_URL:
        raise ValueError(f"is longer than {MAX_RETURN_URL} characters.")
    if any(c.isspace() or not c.isprintable() or c == "\\" for c in url):
        raise ValueError("must not contain whitespace, control characters or backslashes.")
    try:
        parsed = urlsplit(url)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
    except ValueError:
        raise ValueError("is not a valid URL.") from None
    if parsed.scheme not in ("http", "https"):  # urlsplit lower-cases the scheme
        raise ValueError("must be an http or https URL.")
    if settings.LIVE_MODE and parsed.scheme != "https":
        raise ValueError("must be https in live mode.")
    if "@" in parsed.netloc:
        raise ValueError("must not carry credentials (user:password@).")
    if not parsed.hostname:
        raise ValueError("must name a host.")
    return url


def create_intent(merchant: Merchant, fields: dict) -> PaymentIntent:
    """A ``requires_confirmation`` intent and its ``payment_intent.created``; the customer's
    ``last_used_at`` moves (SQL clock)."""
    customer = validate_payment(merchant, fields)
    # No savepoint inside the API's transaction (two round trips a payment): no caller goes on
    # after a failed create; its transaction is marked for rollback instead.
    with transaction.atomic(savepoint=False):
        # Touched first: the UPDATE takes the customer's row lock before the intent names it.
        # A delete that committed since validate_payment left no row (refused here, not a
        # foreign-key violation at commit); one that starts now waits for this commit.
        if customer is not None and not repository.touch_customer(customer.id):
            raise InvalidInput("resource_missing", f"No such customer: {customer.id!r}.", param="customer")
        intent = insert_row(
            PaymentIntent,
            merchant=merchant,
            customer=customer,
            amount=fields["amount"],
            currency=fields["currency"],
            rail=fields["rail"],
            metadata=fields.get("metadata", {}),
            capture_method=fields.get("capture_method") or CaptureMethod.AUTOMATIC,
        )
        # No read back: every column the database fills (status, amounts, created_at) comes
        # back with the INSERT (RETURNING: Django returns fields with a db_default).
        emit(merchant, EventType.PAYMENT_INTENT_CREATED, render_new_intent(intent, for_event=True))
    return intent


def create_session(merchant: Merchant, fields: dict) -> CheckoutSession:
    """An intent and an ``open`` session for it; ``expires_at`` is the database's now() + 24 h.
    The return URLs are judged by :func:`clean_return_url` before anything is written."""
    urls = {}
    for name in ("success_url", "cancel_url"):
        if name in fields:
            try:
                urls[name] = clean_return_url(fields[name])
            except ValueError as exc:
                raise InvalidInput("parameter_invalid", f"{name}: {exc}", param=name) from None
    with transaction.atomic(savepoint=False):  # as create_intent's
        intent = create_intent(merchant, {k: v for k, v in fields.items() if k not in ("success_url", "cancel_url")})
        session = CheckoutSession.objects.create(
            merchant=merchant,
            intent=intent,
            # The payer's page authenticates with it; shaped so the log redaction catches it.
            client_secret=new_token("cs_secret_", bits=192),
            success_url=urls.get("success_url", ""),
            cancel_url=urls.get("cancel_url", ""),
        )
    session.refresh_from_db()
    return session
