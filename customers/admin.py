"""Customers in the ops console: read-only (the merchant owns the data through the API)."""

from django.contrib import admin

from customers.models import Customer


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("id", "merchant", "created_at", "last_used_at")
    list_filter = ("merchant",)
    search_fields = ("id",)  # by id only: the console is not a personal-data search engine
    list_select_related = ("merchant",)
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
