"""Events, endpoints and deliveries in the ops console.

Read-only, except the actions: re-drive abandoned events (``webhooks.redrive_event``) and
resend deliveries (``webhooks.resend_webhookdelivery``), one by one or every delivery that
failed in a window (``webhooks.admin_bulk``). Each is two steps, as the dead letters'
actions: a confirmation page saying what will happen to each selected row, with a required
reason, then the act, recorded with who and why on each row's History
(``webhooks.admin_actions``). No page ever shows a signing secret: endpoints show how many
are active, nothing else. Deliveries show their attempts inline, newest last, with the
bounded excerpt and error. List columns come from the list's own query (annotations), never
one query per row.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import Count, OuterRef, Q, Subquery
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from jobs.admin import ReadOnlyAdmin
from jobs.models import TransactionNow
from webhooks import admin_actions, admin_bulk
from webhooks.endpoint_admin import EndpointStateActions
from webhooks.models import DeliveryAttempt, Event, WebhookDelivery, WebhookEndpoint

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

    @admin.action(description="Re-drive selected abandoned events (fan them out again)…", permissions=["redrive"])
    def redrive_selected(self, request, queryset):
        return admin_actions.redrive(self, request, queryset)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(EndpointStateActions, ReadOnlyAdmin):
    list_display = ("id", "merchant_id", "url", "enabled_events", "active_secrets", "deleted_at", "created_at")
    list_filter = ("deleted_at",)
    search_fields = ("=id", "=merchant__id", "url")
    fields = ("id", "merchant", "url", "enabled_events", "description", "active_secrets", "created_at", "deleted_at")
    readonly_fields = fields

    def get_queryset(self, request):
        # Secrets still signing now, counted in the list's own query (on the database clock).
        signing = Q(secrets__expires_at__isnull=True) | Q(secrets__expires_at__gt=TransactionNow())
        return super().get_queryset(request).annotate(active_secret_count=Count("secrets", filter=signing))

    @admin.display(description="active secrets")
    def active_secrets(self, obj):
        return obj.active_secret_count  # a count: secrets are never shown


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

    def get_queryset(self, request):
        # The newest attempt's error, in the list's own query (webhook_attempts_delivery_number).
        newest = DeliveryAttempt.objects.filter(delivery=OuterRef("pk")).order_by("-number").values("error")[:1]
        return super().get_queryset(request).annotate(last_error_sql=Subquery(newest))

    @admin.display(description="last error")
    def last_error(self, obj):
        return Truncator((getattr(obj, "last_error_sql", None) or "").strip()).chars(EXCERPT)

    def has_resend_permission(self, request):
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.resend_{opts.model_name}")

    @admin.action(description="Resend selected deliveries…", permissions=["resend"])
    def resend_selected(self, request, queryset):
        return admin_actions.resend(self, request, queryset)

    # --- bulk resend: every delivery that failed in a window, as one bulk operation ---------

    def get_urls(self):
        view = self.admin_site.admin_view(self.bulk_resend_view)
        return [path("bulk-resend/", view, name="webhooks_webhookdelivery_bulk_resend"), *super().get_urls()]

    def bulk_resend_view(self, request):
        return admin_bulk.view(self, request)

    def changelist_view(self, request, extra_context=None):
        url = reverse("admin:webhooks_webhookdelivery_bulk_resend") if self.has_resend_permission(request) else None
        return super().changelist_view(request, {**(extra_context or {}), "bulk_resend_url": url})
