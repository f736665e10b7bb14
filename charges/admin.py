"""Charges in the ops console: read-only; unresolved charges first, because they are the
ones a human has been asked to reconcile against the rail's statement."""

from django.contrib import admin
from django.db.models import Case, IntegerField, Value, When

from charges.models import Charge, CheckoutSession, PaymentIntent, ProviderRequest, Refund
from charges.money import format_amount
from charges.states import ChargeStatus, RefundStatus


class ReadOnly(admin.ModelAdmin):
    show_full_result_count = False

    # Amounts read in their currency ($10.00, ¥1,000, BHD 1.000); the detail page keeps the
    # stored integer beside it, the minor units a rail's statement lists.
    @admin.display(description="amount", ordering="amount")
    def amount_shown(self, obj):
        return format_amount(obj.amount, obj.currency)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ProviderRequestInline(admin.TabularInline):
    model = ProviderRequest
    fields = ("operation", "method", "path", "sent_at", "answered_at", "status_code", "rail_status", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-id",)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Charge)
class ChargeAdmin(ReadOnly):
    list_display = ("id", "status", "rail", "flow", "amount_shown", "failure_code", "created_at", "unresolved_at")
    readonly_fields = ("amount_shown",)
    list_filter = ("status", "rail", "flow")
    search_fields = ("id", "intent__id")
    list_select_related = ("merchant",)
    # Never the pay_token or the URL carrying it: the payer's, not the operator's.
    exclude = ("pay_token", "redirect_url")
    inlines = [ProviderRequestInline]

    def get_queryset(self, request):
        unresolved_first = Case(
            When(status=ChargeStatus.UNRESOLVED, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        return super().get_queryset(request).order_by(unresolved_first, "-created_at")


class RefundRequestInline(ProviderRequestInline):
    fk_name = "refund"


@admin.register(Refund)
class RefundAdmin(ReadOnly):
    """Unresolved refunds first: a human has been asked to reconcile them with the rail."""

    list_display = (
        "id",
        "status",
        "rail",
        "amount_shown",
        "reason",
        "failure_code",
        "intent",
        "merchant",
        "created_at",
        "unresolved_at",
    )
    list_filter = ("status", "rail", "reason", "currency")
    readonly_fields = ("amount_shown",)
    search_fields = ("id", "intent__id", "charge__id")
    list_select_related = ("merchant",)
    date_hierarchy = "created_at"
    inlines = [RefundRequestInline]

    def get_queryset(self, request):
        unresolved_first = Case(
            When(status=RefundStatus.UNRESOLVED, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        return super().get_queryset(request).order_by(unresolved_first, "-created_at")


@admin.register(PaymentIntent)
class PaymentIntentAdmin(ReadOnly):
    list_display = ("id", "status", "rail", "amount_shown", "refunded_shown", "merchant", "created_at")
    list_filter = ("status", "rail", "currency")
    readonly_fields = ("amount_shown", "refunded_shown")
    search_fields = ("id",)
    list_select_related = ("merchant",)

    @admin.display(description="amount refunded", ordering="amount_refunded")
    def refunded_shown(self, obj):
        return format_amount(obj.amount_refunded, obj.currency)


@admin.register(CheckoutSession)
class CheckoutSessionAdmin(ReadOnly):
    list_display = ("id", "status", "payment_status", "intent", "created_at", "expires_at")
    list_filter = ("status", "payment_status")
    search_fields = ("id",)
    exclude = ("client_secret",)
