"""Customer create/update/delete: each write and its event in one transaction."""

from __future__ import annotations

from django.db import transaction

from customers.models import Customer
from customers.wire import render_deleted
from merchants.models import Merchant
from webhooks.event_types import EventType
from webhooks.events import emit


def create_customer(merchant: Merchant, fields: dict) -> Customer:
    return Customer.objects.create(merchant=merchant, **fields)


def update_customer(customer: Customer, fields: dict) -> Customer:
    for name, value in fields.items():
        setattr(customer, name, value)
    customer.save(update_fields=list(fields))
    return customer


@transaction.atomic
def delete_customer(customer: Customer) -> None:
    """Erase the customer and emit ``customer.deleted`` (ids only) with it."""
    customer_id = customer.id
    customer.delete()
    emit(customer.merchant, EventType.CUSTOMER_DELETED, render_deleted(customer_id))
