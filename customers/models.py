"""Customers: personal data a merchant stores with us, erased when idle for a year."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from vpay.ids import ID_MAX_LENGTH, new_id


def new_customer_id() -> str:
    return new_id("cus")


class Customer(models.Model):
    """A merchant's customer. ``last_used_at`` moves (on the database clock) whenever an
    intent is created or confirmed for them; the retention sweep reads nothing else.
    Personal fields never reach a log line or a ``repr``: ids only."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_customer_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="customers")
    email = models.CharField(max_length=254, blank=True, db_default="")
    name = models.CharField(max_length=256, blank=True, db_default="")
    phone = models.CharField(max_length=32, blank=True, db_default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "customers"
        indexes = [
            models.Index(fields=["merchant", "-created_at", "-id"], name="customers_merchant_recent"),
            models.Index(fields=["last_used_at"], name="customers_last_used"),
        ]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<Customer {self.id} merchant={self.merchant_id}>"
