"""Stored answers to POSTs made with an ``Idempotency-Key``."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class IdempotencyRecord(models.Model):
    """The first successful answer to a POST made with a given key, replayed for 24 h.

    Keyed per merchant: two merchants may use the same key. ``request_hash`` covers the
    method, the path and the body, so the same key on a different request is refused.
    """

    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.SmallIntegerField()
    body = models.BinaryField(help_text="The answer, sealed (Fernet): it may carry a secret shown once.")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "api_idempotency_records"
        constraints = [
            models.UniqueConstraint(fields=["merchant", "key"], name="api_idempotency_merchant_key"),
        ]
        indexes = [models.Index(fields=["created_at"], name="api_idempotency_created")]

    def __str__(self) -> str:
        return f"idempotency record {self.pk}"

    def __repr__(self) -> str:
        return f"<IdempotencyRecord {self.pk} merchant={self.merchant_id}>"
