"""Merchants in the ops console. Keys are never shown (only their last four characters);
a new key is issued with ``createmerchant`` or by the merchant's own key rotation, not here."""

from django.contrib import admin

from merchants.models import ApiKey, Merchant


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("__str__", "created_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Merchant)
class MerchantAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "created_at")
    search_fields = ("id", "name")
    readonly_fields = ("id", "created_at")
    inlines = [ApiKeyInline]

    def has_add_permission(self, request):
        return False  # createmerchant prints the key once; an admin form could not

    def has_delete_permission(self, request, obj=None):
        return False  # events and customers point at it; erase through the retention rules
