"""Merchants, their secret keys and OAuth clients in the ops console.

Keys are never shown, only their last four characters, except a new key from *Roll secret
key*, shown once on the page that answers the roll. Every action is two-step with a reason
(the shape of Django's ``delete_selected``: a form re-posting the selection, then the act),
gated by its own permission, and done by the services (``merchants.services``,
``merchants.clients``), which record it on the merchant's History.
"""

from __future__ import annotations

import re

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from merchants import clients, services
from merchants.models import ApiKey, Merchant, OAuthClient
from vpay.errors import DomainError

REASON_FORM = "admin/merchants/reason_form.html"
# ASCII digits only: str.isdigit also takes "²" (which int() refuses) and other scripts'
# digits; ten digits keep int() cheap, and the service bounds the value.
_SECONDS = re.compile(r"[0-9]{1,10}")


def _with_reason(model_admin, request, queryset, *, action, title, explanation, act, describe, overlap_field=False):
    """The reason form, then ``act(item, reason, overlap)`` per item; returns the act's
    results, or the form's response while there is nothing to act on yet."""
    reason = request.POST.get("reason", "")
    overlap = request.POST.get("overlap", str(settings.VPAY_API_KEY_ROLL_OVERLAP_SECONDS))
    error = ""
    if request.POST.get("post") == "yes":
        if not reason.strip():
            error = "A reason is required: it is recorded with the change."
        elif overlap_field and not _SECONDS.fullmatch(overlap):
            error = "The overlap is a whole number of seconds."
        else:
            results = []
            for item in queryset:
                try:
                    results.append((item, act(item, reason, int(overlap) if overlap_field else 0), None))
                except DomainError as exc:
                    results.append((item, None, exc.message))
            return results
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        "selected_ids": [obj.pk for obj in queryset],
        "items": [describe(obj) for obj in queryset],
        "action": action,
        "title": title,
        "explanation": explanation,
        "reason": reason,
        "overlap": overlap,
        "overlap_field": overlap_field,
        "error": error,
    }
    return TemplateResponse(request, REASON_FORM, context, status=400 if error else 200)


def _report(request, results, verb: str) -> None:
    for item, _done, refused in results:
        if refused is None:
            messages.success(request, f"{verb} {item}.")
        else:
            messages.warning(request, f"Refused for {item}: {refused}")


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("id", "__str__", "created_at", "expires_at", "revoked_at", "revoked_reason")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class OAuthClientInline(admin.TabularInline):
    model = OAuthClient
    fields = ("id", "name", "created_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Merchant)
class MerchantAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "created_at")
    search_fields = ("id", "name")
    readonly_fields = ("id", "created_at")
    inlines = [ApiKeyInline, OAuthClientInline]
    actions = ["roll_secret_key"]

    def has_add_permission(self, request):
        return False  # createmerchant prints the key once; an admin form could not

    def has_delete_permission(self, request, obj=None):
        return False  # events and customers point at it; erase through the retention rules

    def has_roll_api_key_permission(self, request):
        return request.user.has_perm("merchants.roll_api_key")

    @admin.action(description="Roll secret key…", permissions=["roll_api_key"])
    def roll_secret_key(self, request, queryset):
        results = _with_reason(
            self,
            request,
            queryset,
            action="roll_secret_key",
            title="Roll secret key",
            explanation=(
                "Each merchant gets a new secret key, shown once on the next page. Its current keys keep "
                "working for the overlap, then stop (by the database clock)."
            ),
            act=lambda merchant, reason, overlap: services.api_key_roll(
                merchant_id=merchant.id, overlap_seconds=overlap, reason=reason, actor=request.user
            )[1],
            describe=str,
            overlap_field=True,
        )
        if isinstance(results, TemplateResponse):
            return results
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "rolled": [(str(m), key) for m, key, refused in results if refused is None],
            "refused": [(m.id, refused) for m, _, refused in results if refused is not None],
            "overlap": request.POST.get("overlap"),
        }
        return TemplateResponse(request, "admin/merchants/rolled_keys.html", context)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("id", "__str__", "merchant", "created_at", "expires_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("merchant__id", "merchant__name", "last4")
    fields = ("merchant", "last4", "created_at", "expires_at", "revoked_at", "revoked_reason")
    readonly_fields = fields
    actions = ["revoke_selected"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_revoke_api_key_permission(self, request):
        return request.user.has_perm("merchants.revoke_api_key")

    @admin.action(description="Revoke selected keys…", permissions=["revoke_api_key"])
    def revoke_selected(self, request, queryset):
        results = _with_reason(
            self,
            request,
            queryset.filter(revoked_at__isnull=True),
            action="revoke_selected",
            title="Revoke",
            explanation="A revoked key stops working now, for good. Keys already revoked are left as they are.",
            act=lambda key, reason, _: services.api_key_revoke(key_id=key.pk, reason=reason, actor=request.user),
            describe=lambda key: f"{key} of {key.merchant}",
        )
        if isinstance(results, TemplateResponse):
            return results
        _report(request, results, "Revoked")
        return None


class OAuthClientForm(forms.ModelForm):
    class Meta:
        model = OAuthClient
        fields = ("merchant", "name", "public_key")

    def clean_public_key(self):
        try:
            clients.public_key_load(self.cleaned_data["public_key"])
        except DomainError as exc:
            if exc.code == "private_key_given":
                # Never render a private key back into the page.
                self.data = self.data.copy()
                self.data["public_key"] = ""
            raise forms.ValidationError(exc.message) from None
        return self.cleaned_data["public_key"]


@admin.register(OAuthClient)
class OAuthClientAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "merchant", "created_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("id", "name", "merchant__id", "merchant__name")
    form = OAuthClientForm
    actions = ["revoke_selected"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("id", "merchant", "name", "public_key", "created_at", "revoked_at", "revoked_reason")

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the History keeps who and why

    def save_model(self, request, obj, form, change):
        created = clients.oauth_client_register(
            merchant_id=obj.merchant_id, name=obj.name, public_key=obj.public_key, actor=request.user
        )
        obj.pk, obj.public_key = created.pk, created.public_key

    def has_revoke_oauth_client_permission(self, request):
        return request.user.has_perm("merchants.revoke_oauth_client")

    @admin.action(description="Revoke selected clients…", permissions=["revoke_oauth_client"])
    def revoke_selected(self, request, queryset):
        results = _with_reason(
            self,
            request,
            queryset.filter(revoked_at__isnull=True),
            action="revoke_selected",
            title="Revoke",
            explanation="A revoked client gets no new token, and the tokens it holds stop working now.",
            act=lambda client, reason, _: clients.oauth_client_revoke(
                client_id=client.id, reason=reason, actor=request.user
            ),
            describe=str,
        )
        if isinstance(results, TemplateResponse):
            return results
        _report(request, results, "Revoked")
        return None
