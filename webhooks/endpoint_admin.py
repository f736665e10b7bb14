"""The ops console's endpoint-state actions: disable, and re-enable, webhook endpoints.

A mixin for ``WebhookEndpointAdmin`` (``webhooks.admin``), kept apart so the console's other
webhook actions and this one change independently. Both actions have the two-step shape
of Django's ``delete_selected``: the first POST renders a form (a ``forms.Form`` with a
required reason) re-posting the selected ids; the confirmed POST acts through
``webhooks.services.endpoint_health`` (which writes the admin History entry in the same
transaction) and returns to the list. Both need ``webhooks.disable_webhookendpoint``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from webhooks.services import endpoint_health

TEMPLATE = "admin/webhooks/webhookendpoint/state_form.html"
HEALTH_FIELDS = ("status", "disabled_at", "disabled_by", "disabled_reason", "health_since", "health_warned_at")


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=endpoint_health.REASON_MAX,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        error_messages={"required": "A reason is required: it is recorded with your name."},
    )


if TYPE_CHECKING:
    # A mixin for ModelAdmin subclasses: typed as one, so its super() calls and
    # self.admin_site are checked against ModelAdmin; at run time a plain base.
    _ModelAdminBase = admin.ModelAdmin
else:
    _ModelAdminBase = object


class EndpointStateActions(_ModelAdminBase):
    """Adds the two actions, the permission behind them, and the health fields to the page."""

    actions = ["disable_selected", "enable_selected"]

    def get_fields(self, request, obj=None):
        return (*super().get_fields(request, obj), *HEALTH_FIELDS)

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), *HEALTH_FIELDS)

    def get_list_display(self, request):
        return (*super().get_list_display(request), "status")

    @admin.display(description="status")
    def status(self, obj):
        if obj.deleted_at is not None:
            return "deleted"
        return "disabled" if obj.disabled_at is not None else "enabled"

    def has_disable_permission(self, request):
        return request.user.has_perm("webhooks.disable_webhookendpoint")

    @admin.action(description="Disable selected endpoints (with a reason)", permissions=["disable"])
    def disable_selected(self, request, queryset):
        user = request.user
        return self._state_action(
            request,
            queryset,
            action="disable_selected",
            title="Disable webhook endpoints",
            eligible=lambda e: e.deleted_at is None and e.disabled_at is None,
            act=lambda e, reason: endpoint_health.endpoint_disable(
                endpoint_id=e.pk, reason=reason, actor=f"operator:{user.get_username()}", user_id=user.pk
            ),
            done="disabled",
            explain="Nothing more is sent to a disabled endpoint and no new delivery is made for it; its pending"
            " deliveries wait and resume when it is re-enabled. The merchant's other endpoints receive"
            " webhook_endpoint.disabled with your reason.",
        )

    @admin.action(description="Re-enable selected endpoints (with a reason)", permissions=["disable"])
    def enable_selected(self, request, queryset):
        user = request.user
        return self._state_action(
            request,
            queryset,
            action="enable_selected",
            title="Re-enable webhook endpoints",
            eligible=lambda e: e.deleted_at is None and e.disabled_at is not None,
            act=lambda e, reason: (
                endpoint_health.endpoint_enable(
                    endpoint_id=e.pk, actor=f"operator:{user.get_username()}", reason=reason, user_id=user.pk
                )
                is not None
            ),
            done="re-enabled",
            explain="Its pending deliveries become due now and resume on their ladders; its health starts"
            " afresh (earlier failures no longer count).",
        )

    def _state_action(self, request, queryset, *, action, title, eligible, act, done, explain):
        endpoints = list(queryset.order_by("id"))
        form = ReasonForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            changed = sum(1 for e in endpoints if eligible(e) and act(e, form.cleaned_data["reason"]))
            skipped = len(endpoints) - changed
            if changed:
                messages.success(request, f"{changed} endpoint{'' if changed == 1 else 's'} {done}.")
            if skipped:
                messages.warning(request, f"{skipped} skipped: deleted, or already {done}.")
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "selected_ids": [e.pk for e in endpoints],
            "endpoints": endpoints,
            "eligible": sum(1 for e in endpoints if eligible(e)),
            "action": action,
            "explain": explain,
            "form": form if form.is_bound else ReasonForm(),
        }
        return TemplateResponse(request, TEMPLATE, context, status=400 if form.is_bound else 200)
