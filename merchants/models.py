"""Merchants and their secret API keys (stored as digests, never as the key)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from api.ids import ID_MAX_LENGTH, new_id


def new_merchant_id() -> str:
    return new_id("acct")


class Merchant(models.Model):
    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_merchant_id, editable=False)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "merchants"
        constraints = [models.CheckConstraint(condition=~Q(name=""), name="merchants_name_not_blank")]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def __repr__(self) -> str:
        return f"<Merchant {self.id}>"


class ApiKey(models.Model):
    """A secret key. Only its SHA-256 digest is stored: the key carries 256 random bits, so a
    fast digest is as good as a slow password hash here and costs nothing per request.
    ``last4`` lets an operator tell keys apart without seeing one."""

    merchant = models.ForeignKey(Merchant, on_delete=models.CASCADE, related_name="api_keys")
    digest = models.CharField(max_length=64, unique=True)
    last4 = models.CharField(max_length=4)
    created_at = models.DateTimeField(db_default=Now())
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "merchant_api_keys"

    def __str__(self) -> str:
        return f"sk_…{self.last4}"

    def __repr__(self) -> str:
        return f"<ApiKey {self.pk} merchant={self.merchant_id} …{self.last4}>"
