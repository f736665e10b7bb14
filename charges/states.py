"""The state machines of ``charges`` (docs/architecture.md §8), each in one place.

The values are the wire and database spellings. The compare-and-swap services that move
them live in ``charges.repository``; every transition there is a guarded write that
matches nothing when the row has left the source state.
"""

from __future__ import annotations

from django.db import models


class IntentStatus(models.TextChoices):
    """Where a payment intent stands."""

    REQUIRES_CONFIRMATION = "requires_confirmation", "Requires confirmation"
    """Created; nothing sent to a rail yet."""
    PROCESSING = "processing", "Processing"
    """Confirmed; its charge is live (also while the charge is ``unresolved``)."""
    REQUIRES_ACTION = "requires_action", "Requires action"
    """Redirect rail: the payer has been handed a URL and has to act."""
    REQUIRES_CAPTURE = "requires_capture", "Requires capture"
    """Manual capture: the rail authorized the charge and holds the money; the merchant
    captures it (``processing`` until the rail confirms) or cancels it (the hold is voided)."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Terminal: the rail settled the charge."""
    FAILED = "failed", "Failed"
    """Terminal: the charge failed; a new intent is needed to try again."""
    CANCELED = "canceled", "Canceled"
    """Terminal: canceled before it was confirmed (no charge was ever made), or while its
    authorization waited for capture (the hold is voided at the rail), or its authorization
    expired uncaptured."""


INTENT_TERMINAL = frozenset({IntentStatus.SUCCEEDED, IntentStatus.FAILED, IntentStatus.CANCELED})


class ChargeStatus(models.TextChoices):
    """Where a charge stands."""

    SUBMITTING = "submitting", "Submitting"
    """Written before the rail is called; also what a crash mid-confirm leaves behind."""
    SUBMITTED = "submitted", "Submitted"
    """The rail accepted it (confirm's compare-and-swap); being polled."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Terminal."""
    FAILED = "failed", "Failed"
    """Terminal (the rail said so, or a redirect order nobody could pay)."""
    UNRESOLVED = "unresolved", "Unresolved"
    """Past the 24 h horizon without a terminal answer: a human is told; still polled hourly."""
    AUTHORIZED = "authorized", "Authorized"
    """Manual capture: the rail holds the money until the merchant captures or cancels it; its
    poll waits for the authorization's expiry (then voids it) and is woken by either."""
    CAPTURING = "capturing", "Capturing"
    """The merchant captured it: the worker sends the capture and polls until the rail confirms."""
    VOIDING = "voiding", "Voiding"
    """Canceled, or its authorization expired: the worker sends the void and polls until the
    rail confirms the hold is released."""
    VOIDED = "voided", "Voided"
    """Terminal: the rail released the authorization; nothing was captured."""


CHARGE_TERMINAL = frozenset({ChargeStatus.SUCCEEDED, ChargeStatus.FAILED, ChargeStatus.VOIDED})
# Charges that have a poll job (the backstop scan restores a lost one). An authorized
# charge's poll waits, parked, for its authorization's expiry; a capture or a cancel wakes it.
CHARGE_LIVE = frozenset(
    {
        ChargeStatus.SUBMITTING,
        ChargeStatus.SUBMITTED,
        ChargeStatus.UNRESOLVED,
        ChargeStatus.AUTHORIZED,
        ChargeStatus.CAPTURING,
        ChargeStatus.VOIDING,
    }
)
# The two rail operations on an authorization, each driven by the charge's poll.
CHARGE_CAPTURE_PHASE = frozenset({ChargeStatus.CAPTURING, ChargeStatus.VOIDING})


class RefundStatus(models.TextChoices):
    """Where a refund stands (the charge's machine, with ``pending`` for ``submitted``)."""

    SUBMITTING = "submitting", "Submitting"
    """Accepted and written; the worker sends it to the rail (also what a crash mid-send leaves)."""
    PENDING = "pending", "Pending"
    """The rail knows it and has not settled it; being polled."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Terminal: the rail returned the money."""
    FAILED = "failed", "Failed"
    """Terminal: the rail refused it; its amount may be refunded again."""
    UNRESOLVED = "unresolved", "Unresolved"
    """Past the horizon without a terminal answer: a human is told; still polled hourly."""


REFUND_TERMINAL = frozenset({RefundStatus.SUCCEEDED, RefundStatus.FAILED})
REFUND_LIVE = frozenset({RefundStatus.SUBMITTING, RefundStatus.PENDING, RefundStatus.UNRESOLVED})


class RefundReason(models.TextChoices):
    """Why the merchant refunds (optional; recorded and shown, never interpreted)."""

    DUPLICATE = "duplicate", "Duplicate"
    FRAUDULENT = "fraudulent", "Fraudulent"
    REQUESTED_BY_CUSTOMER = "requested_by_customer", "Requested by customer"


class CancellationReason(models.TextChoices):
    """Why the merchant canceled an intent (optional; recorded and shown)."""

    DUPLICATE = "duplicate", "Duplicate"
    FRAUDULENT = "fraudulent", "Fraudulent"
    REQUESTED_BY_CUSTOMER = "requested_by_customer", "Requested by customer"
    ABANDONED = "abandoned", "Abandoned"
    EXPIRED = "expired", "Expired"
    """Set by vpay, never by a merchant: the authorization expired uncaptured."""


class CheckoutSessionStatus(models.TextChoices):
    """Whether a checkout session can still be paid."""

    OPEN = "open", "Open"
    """Payable until ``expires_at``."""
    COMPLETE = "complete", "Complete"
    """Its intent succeeded."""
    EXPIRED = "expired", "Expired"
    """Past 24 h (the hourly sweep); payment status untouched."""


class CheckoutPaymentStatus(models.TextChoices):
    """What happened to a checkout session's money."""

    UNPAID = "unpaid", "Unpaid"
    PAID = "paid", "Paid"


class CaptureMethod(models.TextChoices):
    """When a confirmed intent's money is taken."""

    AUTOMATIC = "automatic", "Automatic (the charge captures when the payer approves)"
    MANUAL = "manual", "Manual (the rail authorizes; the merchant captures or cancels later)"


class RailFlow(models.TextChoices):
    """How a payer approves a charge on a rail; a capability of the rail, never its name."""

    PUSH = "push", "Push (approve on a device; poll by reference)"
    REDIRECT = "redirect", "Redirect (payer is handed a URL; polling needs the pay_token)"


class RailStatus(models.TextChoices):
    """What the rail answered about a charge (or that it did not answer)."""

    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    AUTHORIZED = "authorized", "Authorized (money held, not captured)"
    CANCELED = "canceled", "Canceled (authorization voided)"
    NOT_FOUND = "not_found", "Not found (404)"
    UNAVAILABLE = "unavailable", "No usable answer (timeout, 5xx)"
