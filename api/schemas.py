"""The JSON Schemas of what ``/v1`` answers: one per wire object (``charges.wire``,
``customers.wire``, ``webhooks.events``, ``webhooks.endpoint_wire``), the list envelope
and the error shape. Views name them in their ``Operation``; ``api.openapi`` publishes
them under ``components/schemas``. ``tests/test_openapi.py`` renders every object and
checks it against its schema, key for key, so a renderer cannot gain or lose a field
unseen.
"""

from __future__ import annotations

from typing import Any

from api.errors import API, AUTHENTICATION, IDEMPOTENCY, INVALID_REQUEST, RATE_LIMIT
from api.framework import METADATA
from charges.states import (
    CancellationReason,
    CaptureMethod,
    ChargeStatus,
    CheckoutPaymentStatus,
    CheckoutSessionStatus,
    IntentStatus,
    RailFlow,
    RefundReason,
    RefundStatus,
)
from vpay.api_version import CURRENT, SUPPORTED
from webhooks.event_types import EventType
from webhooks.models import AttemptState, DeliveryState

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = (), description: str = "") -> Schema:
    """An object whose properties are all present (but ``optional``); open to new ones, as
    a client should read it (the test holds the renderers to exactly these)."""
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
    }
    if description:
        schema["description"] = description
    return schema


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
TIMESTAMP = {"type": "integer", "description": "Unix time, seconds."}
LIVEMODE = {"type": "boolean", "description": "Whether the deployment that made it is live (VPAY_LIVE_MODE)."}
METADATA_SCHEMA: Schema = {"type": "object", **(METADATA.schema or {})}


def _enum(choices) -> Schema:
    return {"type": "string", "enum": list(choices.values)}


def _wire(kind: str, properties: dict[str, Schema], **kwargs: Any) -> Schema:
    return _obj({"id": STRING, "object": {"const": kind}, **properties, "livemode": LIVEMODE}, **kwargs)


CHARGE = _wire(
    "charge",
    {
        "payment_intent": STRING,
        "amount": INTEGER,
        "currency": STRING,
        "rail": STRING,
        "flow": _enum(RailFlow),
        "status": _enum(ChargeStatus),
        "captured": {"type": "boolean", "description": "Whether the money moved (status succeeded)."},
        "amount_captured": {**INTEGER, "description": "Minor units captured: 0 until it succeeds."},
        "failure_code": nullable(STRING),
        "redirect_url": nullable(STRING),
        "created": TIMESTAMP,
    },
)

PAYMENT_INTENT = _wire(
    "payment_intent",
    {
        "amount": INTEGER,
        "currency": STRING,
        "rail": STRING,
        "status": _enum(IntentStatus),
        "customer": nullable(STRING),
        "metadata": METADATA_SCHEMA,
        "capture_method": _enum(CaptureMethod),
        "amount_capturable": {
            **INTEGER,
            "description": "Minor units the rail holds for a manual capture (requires_capture); 0 otherwise.",
        },
        "amount_received": {**INTEGER, "description": "Minor units captured; refunds are bounded by it."},
        "amount_refunded": INTEGER,
        "canceled_at": nullable(TIMESTAMP),
        "cancellation_reason": nullable(_enum(CancellationReason)),
        "charge": nullable(ref("charge")),
        "redirect_url": nullable(STRING),
        "next_action": nullable(
            _obj({"type": {"const": "redirect_to_url"}, "redirect_url": STRING}),
        ),
        "last_payment_error": nullable(_obj({"code": nullable(STRING)})),
        "created": TIMESTAMP,
    },
)

REFUND = _wire(
    "refund",
    {
        "payment_intent": STRING,
        "charge": STRING,
        "amount": INTEGER,
        "currency": STRING,
        "reason": nullable(_enum(RefundReason)),
        "status": _enum(RefundStatus),
        "failure_code": nullable(STRING),
        "created": TIMESTAMP,
    },
)

CHECKOUT_SESSION = _wire(
    "checkout.session",
    {
        "status": _enum(CheckoutSessionStatus),
        "payment_status": _enum(CheckoutPaymentStatus),
        "payment_intent": STRING,
        "amount": INTEGER,
        "currency": STRING,
        "rail": STRING,
        "customer": nullable(STRING),
        "metadata": METADATA_SCHEMA,
        "url": nullable(STRING),
        "client_secret": nullable(STRING),
        "success_url": nullable(STRING),
        "cancel_url": nullable(STRING),
        "expires_at": TIMESTAMP,
        "created": TIMESTAMP,
    },
)

CUSTOMER = _wire(
    "customer",
    {
        "email": nullable(STRING),
        "name": nullable(STRING),
        "phone": nullable(STRING),
        "metadata": METADATA_SCHEMA,
        "created": TIMESTAMP,
    },
)


def _deleted(kind: str) -> Schema:
    return _obj(
        {"id": STRING, "object": {"const": kind}, "deleted": {"const": True}},
        description="A deleted object: its id alone.",
    )


# One named enum for every place an event type appears: a client generator names an inline
# enum after its property (the event's "type", the event_type's "type") and refuses two
# different enums under one name.
EVENT_TYPE_NAME: Schema = {**_enum(EventType), "description": "An event's type."}

EVENT = _obj(
    {
        "id": STRING,
        "object": {"const": "event"},
        "type": ref("event_type_name"),
        "created": TIMESTAMP,
        "data": _obj({"object": {"type": "object", "description": "The object as it was when the event happened."}}),
        "livemode": LIVEMODE,
        "api_version": {**ref("api_version"), "description": "The API version its object was rendered in."},
    },
    # An event written before its object carried livemode, or before events carried their
    # version, renders without it (its signed body never changes).
    optional=("livemode", "api_version"),
    description="An event, as it is delivered to webhook endpoints.",
)

WEBHOOK_ENDPOINT = _wire(
    "webhook_endpoint",
    {
        "url": STRING,
        "enabled_events": {"type": "array", "items": STRING},
        "description": STRING,
        "created": TIMESTAMP,
        "active_secrets": INTEGER,
        "status": {"type": "string", "enum": ["enabled", "disabled"]},
        "disabled_reason": nullable(STRING),
        "secret": {"type": "string", "description": "The signing secret (whsec_…): only in the answer that made it."},
    },
    optional=("secret",),
)

DELIVERY_ATTEMPT = _obj(
    {
        "number": INTEGER,
        "state": {"type": "string", "enum": list(AttemptState.values)},
        "status_code": nullable(INTEGER),
        "started": TIMESTAMP,
        "finished": nullable(TIMESTAMP),
        "duration_ms": nullable(INTEGER),
        "response_excerpt": nullable(STRING),
        "error": nullable(STRING),
    },
    description="One attempt of a delivery: never the signature or the secret.",
)

WEBHOOK_DELIVERY = _wire(
    "webhook_delivery",
    {
        "webhook_endpoint": STRING,
        "event": STRING,
        "event_type": ref("event_type_name"),
        "state": _enum(DeliveryState),
        "created": TIMESTAMP,
        "next_attempt": nullable(TIMESTAMP),
        "completed": nullable(TIMESTAMP),
        "last_status_code": nullable(INTEGER),
        "cancel_reason": nullable(STRING),
        "attempt_count": INTEGER,
        "attempts": {"type": "array", "items": DELIVERY_ATTEMPT, "description": "The latest attempts, newest first."},
    },
)

EVENT_TYPE = _obj(
    {"object": {"const": "event_type"}, "type": ref("event_type_name"), "description": STRING, "livemode": LIVEMODE},
)

ERROR = _obj(
    {
        "error": _obj(
            {
                "type": {"type": "string", "enum": [INVALID_REQUEST, AUTHENTICATION, IDEMPOTENCY, RATE_LIMIT, API]},
                "code": {"type": "string", "description": "For machines; the codes each status carries are listed."},
                "message": {"type": "string", "description": "For humans; never carries a secret."},
                "param": nullable(STRING),
                "request_id": {
                    "type": "string",
                    "description": "This request's id (req_…), also its Request-Id header: quote it to support.",
                },
            }
        )
    },
    description="Every /v1 4xx and 5xx.",
)

OAUTH_TOKEN = _obj(
    {
        "access_token": {"type": "string", "description": "at_live_… / at_test_…"},
        "token_type": {"const": "Bearer"},
        "expires_in": {"type": "integer", "description": "Seconds."},
    }
)

OAUTH_ERROR = _obj(
    {
        "error": {
            "type": "string",
            "enum": [
                "invalid_request",
                "invalid_client",
                "invalid_grant",
                "unsupported_grant_type",
                "server_error",
                "rate_limited",
                "too_many_tokens",
            ],
        },
        "error_description": STRING,
    },
    description="The token endpoint's refusals (RFC 6749 §5.2), not the /v1 error shape.",
)

API_VERSION: Schema = {
    "type": "string",
    "enum": list(SUPPORTED),
    "description": f"A version of the API (its release date); {CURRENT} is the current one.",
}

OBJECTS: dict[str, Schema] = {
    "payment_intent": PAYMENT_INTENT,
    "charge": CHARGE,
    "refund": REFUND,
    "checkout.session": CHECKOUT_SESSION,
    "customer": CUSTOMER,
    "deleted_customer": _deleted("customer"),
    "event": EVENT,
    "webhook_endpoint": WEBHOOK_ENDPOINT,
    "deleted_webhook_endpoint": _deleted("webhook_endpoint"),
    "webhook_delivery": WEBHOOK_DELIVERY,
    "event_type": EVENT_TYPE,
    "error": ERROR,
    "oauth_token": OAUTH_TOKEN,
    "oauth_error": OAUTH_ERROR,
}
"""Every named schema, as ``components/schemas`` publishes them."""


def list_of(name: str) -> Schema:
    """The envelope of a list of ``name`` objects (``api.lists.paginate``)."""
    return _obj(
        {
            "object": {"const": "list"},
            "url": STRING,
            "has_more": {"type": "boolean"},
            "data": {"type": "array", "items": ref(name)},
        }
    )
