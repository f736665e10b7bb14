"""The events outbox."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from api.ids import ID_MAX_LENGTH, new_id
from webhooks.event_types import EventType


def new_event_id() -> str:
    return new_id("evt")


class FanOut(models.TextChoices):
    PENDING = "pending"
    FANNED_OUT = "fanned_out"
    ABANDONED = "abandoned"


class Event(models.Model):
    """One thing that happened to a merchant's object, written in the same transaction as
    the change (``webhooks.events.emit``). ``data`` is the rendered wire object: the webhook
    body and ``GET /v1/events/{id}`` both serve it, so the two can never disagree."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_event_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="events")
    type = models.CharField(max_length=100, choices=EventType.choices)
    data = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())
    fan_out = models.CharField(max_length=16, choices=FanOut.choices, db_default=FanOut.PENDING)
    fan_out_failures = models.SmallIntegerField(db_default=0)

    class Meta:
        db_table = "events"
        constraints = [
            models.CheckConstraint(condition=Q(type__in=EventType.values), name="events_type_known"),
            models.CheckConstraint(condition=Q(fan_out__in=FanOut.values), name="events_fan_out_known"),
        ]
        indexes = [
            models.Index(fields=["merchant", "-created_at", "-id"], name="events_merchant_recent"),
            models.Index(fields=["created_at"], name="events_pending_fan_out", condition=Q(fan_out=FanOut.PENDING)),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"

    def __repr__(self) -> str:
        return f"<Event {self.id} {self.type} merchant={self.merchant_id}>"
