"""The closed set of event types vpay emits (and endpoints may subscribe to)."""

from django.db import models


class EventType(models.TextChoices):
    PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
    PAYMENT_INTENT_PAYMENT_FAILED = "payment_intent.payment_failed"
    PAYMENT_INTENT_CANCELED = "payment_intent.canceled"
    CHARGE_UNRESOLVED = "charge.unresolved"
    CHECKOUT_SESSION_COMPLETED = "checkout.session.completed"
    CHECKOUT_SESSION_EXPIRED = "checkout.session.expired"
    CUSTOMER_DELETED = "customer.deleted"
    REFUND_SUCCEEDED = "refund.succeeded"
    REFUND_FAILED = "refund.failed"
    # Operational: about one of the merchant's endpoints, sent to its other endpoints.
    WEBHOOK_ENDPOINT_FAILING = "webhook_endpoint.failing"
    WEBHOOK_ENDPOINT_DISABLED = "webhook_endpoint.disabled"
