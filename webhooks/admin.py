"""Events, endpoints and deliveries in the ops console.

Read-only, except one action: resend deliveries (gated by ``webhooks.resend_webhookdelivery``).
No page ever shows a signing secret: endpoints show how many are active, nothing else.
Deliveries show their attempts inline, newest last, with the bounded excerpt and error.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils.html import format_html
from django.utils.text import Truncator

from jobs.admin import ReadOnlyAdmin
from webhooks.endpoint_admin import EndpointStateActions
from webhooks.models import DeliveryAttempt, DeliveryState, Event, WebhookDelivery, WebhookEndpoint
from webhooks.services import endpoints as endpoint_services
from webhooks.services.redrive import redrive_event
from webhooks.services.resend import resend_delivery

EXCERPT = 80


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "type", "merchant_id", "fan_out", "fan_out_failures", "created_at")
    list_filter = ("fan_out", "type")
    search_fields = ("=id", "=merchant__id")
    search_help_text = "Exact event id or merchant id."
    ordering = ("-created_at",)
    fields = (
        "id",
        "type",
        "merchant",
        "created_at",
        "fan_out",
        "fan_out_failures",
        "fan_out_transient_failures",
        "fan_out_redrives",
        "data_pretty",
    )
    readonly_fields = fields
    actions = ["redrive_selected"]

    @admin.display(description="data (the rendered wire object)")
    def data_pretty(self, obj):
        return format_html('<pre class="vpay-pre">{}</pre>', json.dumps(obj.data, indent=2, sort_keys=True))

    def has_redrive_permission(self, request):
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.redrive_{opts.model_name}")

    @admin.action(description="Re-drive selected abandoned events (fan them out again)", permissions=["redrive"])
    def redrive_selected(self, request, queryset):
        redriven, skipped = _apply_each(queryset, lambda pk: redrive_event(pk, actor=request.user))
        if redriven:
            messages.success(request, f"{redriven} event{'' if redriven == 1 else 's'} back to pending fan-out.")
        if skipped:
            messages.warning(request, f"{skipped} skipped: not abandoned.")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(EndpointStateActions, ReadOnlyAdmin):
    list_display = ("id", "merchant_id", "url", "enabled_events", "active_secrets", "deleted_at", "created_at")
    list_filter = ("deleted_at",)
    search_fields = ("=id", "=merchant__id", "url")
    fields = ("id", "merchant", "url", "enabled_events", "description", "active_secrets", "created_at", "deleted_at")
    readonly_fields = fields

    @admin.display(description="active secrets")
    def active_secrets(self, obj):
        return endpoint_services.active_secret_count(obj)  # a count: secrets are never shown


class AttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ("number", "state", "status_code", "duration_ms", "started_at", "finished_at", "error", "excerpt")
    readonly_fields = fields
    ordering = ("number",)
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="response excerpt")
    def excerpt(self, obj):
        return format_html('<pre class="vpay-pre">{}</pre>', obj.response_excerpt or "")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "event_id",
        "endpoint_id",
        "state",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "last_error",
    )
    list_filter = ("state",)
    search_fields = ("=event__id", "=endpoint__id")
    search_help_text = "Exact event id or endpoint id."
    ordering = ("-id",)
    fields = (
        "id",
        "event",
        "endpoint",
        "state",
        "attempts",
        "ladder_base",
        "next_attempt_at",
        "lease_expires_at",
        "payload_sha256",
        "last_status_code",
        "cancel_reason",
        "created_at",
        "updated_at",
        "completed_at",
    )
    readonly_fields = fields
    inlines = [AttemptInline]
    actions = ["resend_selected"]

    @admin.display(description="last error")
    def last_error(self, obj):
        last = obj.attempt_rows.order_by("-number").values_list("error", flat=True).first()
        return Truncator((last or "").strip()).chars(EXCERPT)

    def has_resend_permission(self, request):
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.resend_{opts.model_name}")

    @admin.action(description="Resend selected deliveries (exhausted, refused or succeeded)", permissions=["resend"])
    def resend_selected(self, request, queryset):
        terminal = (DeliveryState.EXHAUSTED, DeliveryState.REFUSED, DeliveryState.SUCCEEDED)
        resent, skipped = _apply_each(queryset, lambda pk: resend_delivery(pk, actor=request.user, states=terminal))
        if resent:
            messages.success(request, f"{resent} deliver{'y' if resent == 1 else 'ies'} queued to be sent again.")
        if skipped:
            messages.warning(request, f"{skipped} skipped: not exhausted, refused or succeeded (already on its way).")


def _apply_each(queryset, act) -> tuple[int, int]:
    """Run ``act(pk)`` on each selected row, each in its own service call; (done, skipped)."""
    outcomes = [bool(act(pk)) for pk in queryset.values_list("pk", flat=True)]
    return sum(outcomes), len(outcomes) - sum(outcomes)
