"""The closed set of event types vpay emits (and endpoints may subscribe to), each with the
one line ``GET /v1/event_types`` describes it by."""

from django.db import models


class EventType(models.TextChoices):
    PAYMENT_INTENT_CREATED = "payment_intent.created"
    PAYMENT_INTENT_PROCESSING = "payment_intent.processing"
    PAYMENT_INTENT_REQUIRES_ACTION = "payment_intent.requires_action"
    PAYMENT_INTENT_AMOUNT_CAPTURABLE_UPDATED = "payment_intent.amount_capturable_updated"
    PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
    PAYMENT_INTENT_PAYMENT_FAILED = "payment_intent.payment_failed"
    PAYMENT_INTENT_CANCELED = "payment_intent.canceled"
    CHARGE_CAPTURED = "charge.captured"
    CHARGE_REFUNDED = "charge.refunded"
    CHARGE_UNRESOLVED = "charge.unresolved"
    CHECKOUT_SESSION_COMPLETED = "checkout.session.completed"
    CHECKOUT_SESSION_EXPIRED = "checkout.session.expired"
    CUSTOMER_DELETED = "customer.deleted"
    REFUND_CREATED = "refund.created"
    REFUND_UPDATED = "refund.updated"
    REFUND_SUCCEEDED = "refund.succeeded"
    REFUND_FAILED = "refund.failed"
    # Operational: about one of the merchant's endpoints, sent to its other endpoints.
    WEBHOOK_ENDPOINT_FAILING = "webhook_endpoint.failing"
    WEBHOOK_ENDPOINT_DISABLED = "webhook_endpoint.disabled"
    # Asked for by the merchant (POST /v1/webhook_endpoints/{id}/test): sent to that endpoint only.
    WEBHOOK_ENDPOINT_TEST = "webhook_endpoint.test"


DESCRIPTIONS: dict[str, str] = {
    EventType.PAYMENT_INTENT_CREATED: "A payment intent was created (through the API or with a checkout session).",
    EventType.PAYMENT_INTENT_PROCESSING: "A payment intent was confirmed; its charge is on its way to the rail.",
    EventType.PAYMENT_INTENT_REQUIRES_ACTION: "A payment intent waits for the payer to approve at the rail's page.",
    EventType.PAYMENT_INTENT_AMOUNT_CAPTURABLE_UPDATED: (
        "A manual-capture payment intent was authorized at the rail (requires_capture): capture"
        " or cancel it before the authorization expires."
    ),
    EventType.PAYMENT_INTENT_SUCCEEDED: "A payment intent's charge succeeded at the rail; the money is captured.",
    EventType.PAYMENT_INTENT_PAYMENT_FAILED: (
        "A payment intent's charge was refused or failed; nothing was charged, and a new intent is needed to try again."
    ),
    EventType.PAYMENT_INTENT_CANCELED: (
        "A payment intent was canceled: before its charge went live, or while its authorization"
        " waited for capture (the hold is voided at the rail), or its authorization expired."
    ),
    EventType.CHARGE_CAPTURED: "A manual-capture charge was captured at the rail (amount_captured says how much).",
    EventType.CHARGE_REFUNDED: "A refund of a charge succeeded (the event carries the charge; its refund has refund.succeeded).",
    EventType.CHARGE_UNRESOLVED: "A charge's outcome is still unknown after its horizon; it is still polled.",
    EventType.CHECKOUT_SESSION_COMPLETED: "A checkout session's payment succeeded.",
    EventType.CHECKOUT_SESSION_EXPIRED: "A checkout session expired (or its intent was canceled) without a payment.",
    EventType.CUSTOMER_DELETED: "A customer was deleted; the event carries its id only.",
    EventType.REFUND_CREATED: "A refund was accepted; it is on its way to the rail.",
    EventType.REFUND_UPDATED: "A refund's status changed (succeeded, failed or unresolved).",
    EventType.REFUND_SUCCEEDED: "A refund succeeded at the rail.",
    EventType.REFUND_FAILED: "A refund failed; its amount can be refunded again.",
    EventType.WEBHOOK_ENDPOINT_FAILING: "Another of your webhook endpoints keeps failing and will be disabled if it goes on.",
    EventType.WEBHOOK_ENDPOINT_DISABLED: "Another of your webhook endpoints was disabled; its deliveries wait.",
    EventType.WEBHOOK_ENDPOINT_TEST: "A test event you asked for, sent to that one endpoint whatever it subscribes to.",
}
"""Every type has its line (``tests/test_webhook_endpoint_tools.py`` checks it)."""
