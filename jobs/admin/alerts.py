"""Alerts and vendor breakers in the ops console: read-only lists."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Case, DurationField, F, Value, When
from django.db.models.expressions import ExpressionWrapper
from django.utils.text import Truncator

from jobs.admin.base import EXCERPT, ReadOnlyAdmin
from jobs.models import Alert, Breaker, BreakerState, TransactionNow
from jobs.operator.durations import humanize_seconds


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "severity",
        "title",
        "source",
        "created_at",
        "logged_at",
        "sent_at",
        "send_attempts",
        "last_error",
    )
    list_filter = ("severity", "source")
    search_fields = ("=key",)
    ordering = ("-created_at", "-id")


@admin.register(Breaker)
class BreakerAdmin(ReadOnlyAdmin):
    """Every vendor breaker (``jobs.primitives.breakers``), open ones first. Read-only: a breaker moves
    only by its vendor's answers; an operator who wants a vendor tried again waits out the
    cool-down (the next call is the probe)."""

    list_display = ("name", "state", "failures", "open_for", "probe_in_flight", "error_excerpt", "updated_at")
    list_filter = ("state",)
    search_fields = ("name",)
    search_help_text = "Part of a name: rail:<code> or webhook_host:<merchant>:<host>:<port>."

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                # Computed by PostgreSQL: the web host's clock never measures an age.
                open_for_sql=ExpressionWrapper(TransactionNow() - F("opened_at"), output_field=DurationField()),
                state_rank=Case(
                    When(state=BreakerState.OPEN, then=Value(0)),
                    When(state=BreakerState.HALF_OPEN, then=Value(1)),
                    default=Value(2),
                ),
            )
            .order_by("state_rank", "name")
        )

    @admin.display(description="open for", ordering="opened_at")
    def open_for(self, obj):
        age = getattr(obj, "open_for_sql", None)
        if obj.state == BreakerState.CLOSED or age is None:
            return "-"
        return humanize_seconds(age.total_seconds())

    @admin.display(description="probe in flight", boolean=True)
    def probe_in_flight(self, obj):
        return obj.probe_token is not None

    @admin.display(description="last error")
    def error_excerpt(self, obj):
        return Truncator((obj.last_error or "").strip()).chars(EXCERPT)
