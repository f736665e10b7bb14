"""Payment intents, their charges, the rail requests made for them, and checkout sessions.

Thin on purpose: the state machines are ``charges.states`` and the only writers of a
status are the compare-and-swap services in ``charges.repository``. Every instant here is
written by PostgreSQL. Credentials of the payer's order (``pay_token``, the redirect URL
carrying it) and a session's client secret never appear in a ``repr``.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Length, Now

from charges.states import (
    CHARGE_LIVE,
    REFUND_LIVE,
    CancellationReason,
    CaptureMethod,
    ChargeStatus,
    CheckoutPaymentStatus,
    CheckoutSessionStatus,
    IntentStatus,
    RailFlow,
    RailStatus,
    RefundReason,
    RefundStatus,
)
from vpay.ids import ID_MAX_LENGTH, new_id
from vpay.sealing import SealedTextField

CHECKOUT_SESSION_LIFETIME = timedelta(hours=24)
EXCERPT_MAX = 1000

# The lookup the excerpt CHECK is written with (registering twice is harmless).
models.TextField.register_lookup(Length, "length")


def new_intent_id() -> str:
    return new_id("pi")


def new_charge_id() -> str:
    return new_id("ch")


def new_session_id() -> str:
    return new_id("cs")


def new_refund_id() -> str:
    return new_id("re")


class PaymentIntent(models.Model):
    """What a merchant wants to be paid, on which rail; confirmed at most once."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_intent_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="payment_intents")
    customer = models.ForeignKey(
        "customers.Customer", null=True, blank=True, on_delete=models.SET_NULL, related_name="payment_intents"
    )
    amount = models.BigIntegerField(help_text="Minor units.")
    currency = models.CharField(max_length=3)
    rail = models.CharField(max_length=32)
    status = models.CharField(
        max_length=32, choices=IntentStatus.choices, db_default=IntentStatus.REQUIRES_CONFIRMATION
    )
    metadata = models.JSONField(default=dict, blank=True)
    capture_method = models.CharField(max_length=16, choices=CaptureMethod.choices, db_default=CaptureMethod.AUTOMATIC)
    # What the rail holds for a manual capture (its authorized amount) while the intent
    # requires capture; 0 otherwise.
    amount_capturable = models.BigIntegerField(db_default=0)
    # What was captured: the amount once it succeeded (a partial capture's less). Refunds are
    # bounded by it.
    amount_received = models.BigIntegerField(db_default=0)
    # The sum of its refunds that are live or succeeded (a failed refund gives its amount
    # back), moved only under this row's lock (charges.refund_repository).
    amount_refunded = models.BigIntegerField(db_default=0)
    cancellation_reason = models.CharField(max_length=32, choices=CancellationReason.choices, null=True, blank=True)
    canceled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "payment_intents"
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="charges_paymentintent_amount_positive"),
            models.CheckConstraint(
                condition=Q(status__in=IntentStatus.values), name="charges_paymentintent_status_known"
            ),
            # Never refunded past what was captured: the database's word, behind the row lock.
            models.CheckConstraint(
                condition=Q(amount_refunded__gte=0) & Q(amount_refunded__lte=F("amount_received")),
                name="charges_paymentintent_refunded_within_received",
            ),
            models.CheckConstraint(
                condition=Q(amount_received__gte=0)
                & Q(amount_received__lte=F("amount"))
                & Q(amount_capturable__gte=0)
                & Q(amount_capturable__lte=F("amount")),
                name="charges_paymentintent_captured_within_amount",
            ),
            models.CheckConstraint(
                condition=Q(capture_method__in=CaptureMethod.values), name="charges_paymentintent_capture_method_known"
            ),
        ]
        indexes = [models.Index(fields=["merchant", "-created_at", "-id"], name="intents_merchant_recent")]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<PaymentIntent {self.id} {self.status} merchant={self.merchant_id}>"


class Charge(models.Model):
    """One attempt to move an intent's money on a rail. Its id is the rail reference (and the
    rail's idempotency key), so a resubmission can never become a second charge."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_charge_id, editable=False)
    # One charge per intent, enforced by the database: a second confirm cannot create one.
    intent = models.OneToOneField(PaymentIntent, on_delete=models.PROTECT, related_name="charge")
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="charges")
    rail = models.CharField(max_length=32)
    # The flow the charge was submitted under: recovery branches on it, and a rails file
    # edited afterwards must not change what an old charge is.
    flow = models.CharField(max_length=16, choices=RailFlow.choices)
    # Submitted as an authorization (the intent's capture_method was manual): fixed at the
    # confirm, as the flow is.
    manual_capture = models.BooleanField(db_default=False)
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16, choices=ChargeStatus.choices, db_default=ChargeStatus.SUBMITTING)
    # Sealed at rest (vpay.sealing): whoever holds either can pay the payer's order.
    pay_token = SealedTextField(null=True, blank=True)
    redirect_url = SealedTextField(null=True, blank=True)
    failure_code = models.CharField(max_length=64, null=True, blank=True)
    # Crash-recovery evidence: status requests answered 404 since the first (database clock).
    not_found_count = models.IntegerField(db_default=0)
    first_not_found_at = models.DateTimeField(null=True, blank=True)
    unresolved_at = models.DateTimeField(null=True, blank=True)
    # Manual capture (database clock): when the rail's authorization was recorded (its expiry
    # counts from here), and when a capture or a void was asked for (the horizon of that
    # operation counts from there).
    authorized_at = models.DateTimeField(null=True, blank=True)
    amount_to_capture = models.BigIntegerField(null=True, blank=True)
    capture_requested_at = models.DateTimeField(null=True, blank=True)
    void_requested_at = models.DateTimeField(null=True, blank=True)
    amount_captured = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "charges"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ChargeStatus.values), name="charges_charge_status_known"),
            models.CheckConstraint(condition=Q(flow__in=RailFlow.values), name="charges_charge_flow_known"),
            models.CheckConstraint(condition=Q(not_found_count__gte=0), name="charges_charge_not_found_non_negative"),
        ]
        indexes = [
            # Used by charges.repository.LIVE_PAGE (the backstop scan): live charges by id.
            models.Index(fields=["id"], condition=Q(status__in=sorted(CHARGE_LIVE)), name="charges_live_idx"),
            models.Index(fields=["merchant", "status", "-created_at"], name="charges_merchant_status"),
        ]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<Charge {self.id} {self.status} rail={self.rail} intent={self.intent_id}>"


class Refund(models.Model):
    """Money sent back to the payer of a succeeded intent, on the intent's rail. Its id is
    the rail reference (and the rail's idempotency key), so a resubmission can never become
    a second refund."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_refund_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="refunds")
    intent = models.ForeignKey(PaymentIntent, on_delete=models.PROTECT, related_name="refunds")
    charge = models.ForeignKey(Charge, on_delete=models.PROTECT, related_name="refunds")
    rail = models.CharField(max_length=32)
    amount = models.BigIntegerField(help_text="Minor units.")
    currency = models.CharField(max_length=3)
    reason = models.CharField(max_length=32, choices=RefundReason.choices, null=True, blank=True)
    status = models.CharField(max_length=16, choices=RefundStatus.choices, db_default=RefundStatus.SUBMITTING)
    failure_code = models.CharField(max_length=64, null=True, blank=True)
    # Crash-recovery evidence, as on charges: status requests answered 404 since the first.
    not_found_count = models.IntegerField(db_default=0)
    first_not_found_at = models.DateTimeField(null=True, blank=True)
    unresolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "refunds"
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="charges_refund_amount_positive"),
            models.CheckConstraint(condition=Q(status__in=RefundStatus.values), name="charges_refund_status_known"),
            models.CheckConstraint(condition=Q(not_found_count__gte=0), name="charges_refund_not_found_non_negative"),
        ]
        indexes = [
            # GET /v1/refunds (?payment_intent=): the merchant's newest first.
            models.Index(fields=["merchant", "-created_at", "-id"], name="refunds_merchant_recent"),
            models.Index(fields=["intent", "-created_at"], name="refunds_intent_recent"),
            # The admin's and an operator's question: which refunds are still in flight.
            models.Index(fields=["id"], condition=Q(status__in=sorted(REFUND_LIVE)), name="refunds_live_idx"),
        ]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<Refund {self.id} {self.status} amount={self.amount} intent={self.intent_id}>"


class RequestOperation(models.TextChoices):
    SUBMIT = "submit", "POST /charges"
    STATUS = "status", "GET /charges/{reference}"
    REFUND_SUBMIT = "refund_submit", "POST /refunds"
    REFUND_STATUS = "refund_status", "GET /refunds/{reference}"
    CAPTURE = "capture", "POST /charges/{reference}/capture"
    VOID = "void", "POST /charges/{reference}/void"


class ProviderRequest(models.Model):
    """One rail request, written (and committed) before it is sent and answered after.

    ``status_code`` NULL means "sent, no answer": the single fact crash recovery branches on,
    distinguishing a request that went out from one that was never made (no row at all).
    """

    charge = models.ForeignKey(Charge, on_delete=models.CASCADE, related_name="requests")
    # Set on a refund's requests (``charge`` is then the refunded charge).
    refund = models.ForeignKey(Refund, on_delete=models.CASCADE, null=True, blank=True, related_name="requests")
    operation = models.CharField(max_length=16, choices=RequestOperation.choices)
    rail = models.CharField(max_length=32)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300, help_text="Relative to the rail's base URL; no query, no credentials.")
    idempotency_key = models.CharField(max_length=ID_MAX_LENGTH, null=True, blank=True)
    sent_at = models.DateTimeField(db_default=Now())
    answered_at = models.DateTimeField(null=True, blank=True)
    status_code = models.IntegerField(null=True, blank=True)
    rail_status = models.CharField(max_length=16, choices=RailStatus.choices, null=True, blank=True)
    # The transport failure's cause chain, or the answer's body, bounded and redacted.
    error = models.TextField(blank=True, db_default="")
    response_excerpt = models.TextField(blank=True, db_default="")

    class Meta:
        db_table = "provider_requests"
        constraints = [
            models.CheckConstraint(
                condition=Q(operation__in=RequestOperation.values), name="charges_providerrequest_operation_known"
            ),
            models.CheckConstraint(
                condition=Q(error__length__lte=EXCERPT_MAX * 2) & Q(response_excerpt__length__lte=EXCERPT_MAX),
                name="charges_providerrequest_excerpts_bounded",
            ),
        ]
        indexes = [
            models.Index(fields=["charge", "operation", "-id"], name="provider_requests_charge_op"),
            # A refund's requests by operation (charges.refund_repository, read_for_poll).
            models.Index(
                fields=["refund", "operation", "-id"],
                condition=Q(refund__isnull=False),
                name="provider_requests_refund_op",
            ),
            # A rail's requests in flight (charges.request_log._WITHIN_CEILING, the ceiling).
            models.Index(
                fields=["rail", "sent_at"], condition=Q(answered_at__isnull=True), name="provider_requests_in_flight"
            ),
            # Retention's keyset pages (charges.retention): oldest first.
            models.Index(fields=["sent_at", "id"], name="provider_requests_sent"),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status_code}"


class CheckoutSession(models.Model):
    """A hosted payment page for one intent, payable for 24 hours.

    ``expires_at`` is computed by PostgreSQL at insert (``now() + 24 h``). The hourly sweep
    moves ``open`` sessions past it to ``expired`` without touching ``payment_status``.
    """

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_session_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="checkout_sessions")
    intent = models.OneToOneField(PaymentIntent, on_delete=models.PROTECT, related_name="checkout_session")
    status = models.CharField(
        max_length=16, choices=CheckoutSessionStatus.choices, db_default=CheckoutSessionStatus.OPEN
    )
    payment_status = models.CharField(
        max_length=16, choices=CheckoutPaymentStatus.choices, db_default=CheckoutPaymentStatus.UNPAID
    )
    client_secret = SealedTextField()  # sealed at rest (vpay.sealing), shown to the merchant in the clear
    success_url = models.URLField(max_length=2000, blank=True, db_default="")
    cancel_url = models.URLField(max_length=2000, blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(db_default=Now() + Value(CHECKOUT_SESSION_LIFETIME))
    completed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "checkout_sessions"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=CheckoutSessionStatus.values), name="charges_checkoutsession_status_known"
            ),
            models.CheckConstraint(
                condition=Q(payment_status__in=CheckoutPaymentStatus.values),
                name="charges_checkoutsession_payment_status_known",
            ),
        ]
        indexes = [
            models.Index(fields=["merchant", "-created_at", "-id"], name="checkout_merchant_recent"),
            # For the hourly expiry sweep: open sessions by expiry.
            models.Index(
                fields=["expires_at"], condition=Q(status=CheckoutSessionStatus.OPEN), name="checkout_open_expiry"
            ),
        ]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<CheckoutSession {self.id} {self.status} intent={self.intent_id}>"
