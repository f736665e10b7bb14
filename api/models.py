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


class RateLimitWindow(models.Model):
    """A merchant's request count in the current fixed window (``api.ratelimit``): one row
    per merchant, rewritten in place by one upsert per request, shared by every web process.

    The table is UNLOGGED (its migration): a counter lost to a database crash only forgives
    one window, and skipping the WAL halves what each request's write costs.
    """

    merchant = models.OneToOneField("merchants.Merchant", on_delete=models.CASCADE, primary_key=True, related_name="+")
    window_start = models.DateTimeField()
    count = models.IntegerField()

    class Meta:
        db_table = "api_rate_limit_windows"

    def __str__(self) -> str:
        return f"rate limit window of {self.merchant_id}"

    def __repr__(self) -> str:
        return f"<RateLimitWindow {self.merchant_id} {self.count}>"


class RateLimitKey(models.Model):
    """A keyed request count in the current fixed window (``api.ratelimit.rate_limit_key``):
    the token endpoint per client and per source address, webhook test events per merchant.
    UNLOGGED like :class:`RateLimitWindow`; the hourly sweep deletes keys long idle."""

    key = models.CharField(max_length=200, primary_key=True)
    window_start = models.DateTimeField()
    count = models.IntegerField()

    class Meta:
        db_table = "api_rate_limit_keys"

    def __str__(self) -> str:
        return f"rate limit window of {self.key}"

    def __repr__(self) -> str:
        return f"<RateLimitKey {self.key} {self.count}>"
