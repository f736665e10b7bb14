"""``/v1/payment_intents`` (create, confirm, capture, cancel), ``/v1/checkout/sessions`` and ``/rails/<code>/callback``."""

from __future__ import annotations

import json
import logging

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from api.framework import METADATA, ApiRequest, Body, Field, error_response, owned, respond, route
from api.ids import ID_MAX_LENGTH
from api.lists import paginate
from api.operations import Operation
from api.params import LIST, Param, takes_query
from api.schemas import list_of, ref
from api.storable import storable
from charges import money, repository
from charges.models import Charge, CheckoutSession, PaymentIntent
from charges.rails import get_rail
from charges.services.cancel import payment_intent_cancel
from charges.services.capture import payment_intent_capture
from charges.services.confirm import confirm_intent
from charges.services.intents import MAX_RETURN_URL, clean_return_url, create_intent, create_session
from charges.states import CHARGE_LIVE, CancellationReason, CaptureMethod, IntentStatus
from charges.wire import render_intent, render_new_intent, render_session
from jobs import port as queue

logger = logging.getLogger(__name__)

# The service bounds an amount (charges/money.py), where the currency is known and the
# refusal can read the bounds in it; the schema only describes them.
AMOUNT_SCHEMA = {"minimum": money.MIN_MINOR, "maximum": money.MAX_MINOR}
AMOUNT_DESCRIPTION = (
    "An integer of the currency's minor units (2 decimals for usd, 0 for jpy and xof, 3 for bhd: "
    "1000 is $10.00, ¥1,000, BHD 1.000); 1 to 10^12 in every currency."
)

PAYMENT_FIELDS = {
    "amount": Field(int, required=True, description=AMOUNT_DESCRIPTION, schema=AMOUNT_SCHEMA),
    "currency": Field(str, required=True, max_length=3, description="Lower case; one of VPAY_CURRENCIES."),
    "rail": Field(str, required=True, max_length=32, description="The code of a configured rail."),
    "customer": Field(str, max_length=ID_MAX_LENGTH),
    "metadata": METADATA,
    "capture_method": Field(
        str,
        choices=CaptureMethod.values,
        description=(
            "automatic (the default): the charge captures when the payer approves. manual: the rail only"
            " authorizes; the intent waits in requires_capture for POST /v1/payment_intents/{id}/capture"
            " or /cancel, and an authorization left VPAY_AUTHORIZATION_EXPIRY_SECONDS (7 days) is voided."
        ),
    ),
}
CREATE_INTENT = Body(**PAYMENT_FIELDS)
_URI = {"format": "uri"}
_RETURN_URL = "Where the payer's browser goes: http or https (https in live mode), a host, no user:password@."
CREATE_SESSION = Body(
    **PAYMENT_FIELDS,
    success_url=Field(str, max_length=MAX_RETURN_URL, check=clean_return_url, description=_RETURN_URL, schema=_URI),
    cancel_url=Field(str, max_length=MAX_RETURN_URL, check=clean_return_url, description=_RETURN_URL, schema=_URI),
)
CONFIRM = Body()  # no parameters; anything sent is an unknown-parameter 400
# "expired" is vpay's own (an authorization that expired), never a merchant's.
CANCEL = Body(
    cancellation_reason=Field(str, choices=[r for r in CancellationReason.values if r != CancellationReason.EXPIRED])
)
CAPTURE = Body(
    amount_to_capture=Field(
        int,
        description="Minor units to capture, at most amount_capturable (the default: all of it); the rest is released.",
        schema=AMOUNT_SCHEMA,
    )
)
# What creating an intent (or a session) refuses beyond the body's own checks.
_PAYMENT_REFUSALS = {400: ("rail_unknown", "currency_unsupported", "resource_missing")}


def _intent(request: ApiRequest, intent_id: str) -> PaymentIntent:
    return owned(request, PaymentIntent.objects.select_related("charge"), intent_id, "payment_intent")


LIST_INTENTS = LIST.extend(
    {
        "status": Param(str, "Only intents in this status.", choices=IntentStatus.values),
        "customer": Param(str, "Only this customer's intents.", max_length=ID_MAX_LENGTH),
    }
)


@route(
    Operation("GET", "List payment intents, newest first.", query=LIST_INTENTS, answers=list_of("payment_intent")),
    Operation(
        "POST",
        "Create a payment intent (requires_confirmation).",
        body=CREATE_INTENT,
        answers=ref("payment_intent"),
        errors=_PAYMENT_REFUSALS,
    ),
)
@takes_query(LIST_INTENTS)
def payment_intents(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        return respond(render_new_intent(create_intent(request.merchant, CREATE_INTENT.parse(request))))
    queryset = PaymentIntent.objects.select_related("charge").filter(merchant=request.merchant)
    if "status" in request.query:
        queryset = queryset.filter(status=request.query["status"])
    if "customer" in request.query:
        queryset = queryset.filter(customer_id=request.query["customer"])
    return paginate(request, queryset, render_intent, request.query)


@route(Operation("GET", "Retrieve a payment intent.", answers=ref("payment_intent")))
def payment_intent(request: ApiRequest, intent_id: str) -> HttpResponse:
    return respond(render_intent(_intent(request, intent_id)))


# Not atomic: confirm commits the charge and its poll job before it calls the rail, and
# acts on the answer in a second transaction (charges/services/confirm.py says why).
@route(
    Operation(
        "POST",
        "Confirm a payment intent: its charge is submitted to the rail.",
        body=CONFIRM,
        answers=ref("payment_intent"),
        errors={
            409: ("payment_intent_unexpected_state", "checkout_session_expired", "rail_unknown"),
            503: ("rail_unavailable",),
        },
    ),
    atomic=False,
)
def confirm(request: ApiRequest, intent_id: str) -> HttpResponse:
    CONFIRM.parse(request)
    return respond(render_intent(confirm_intent(request.merchant, intent_id)))


# Not a rail call: the capture is accepted here and sent by the charge's poll
# (charges/services/capture.py says why).
@route(
    Operation(
        "POST",
        "Capture an authorized payment intent (requires_capture); the worker captures it at the rail.",
        body=CAPTURE,
        answers=ref("payment_intent"),
        errors={
            400: ("amount_too_large", "parameter_out_of_range"),
            409: ("payment_intent_unexpected_state", "rail_unknown"),
        },
    )
)
def capture(request: ApiRequest, intent_id: str) -> HttpResponse:
    fields = CAPTURE.parse(request)
    return respond(render_intent(payment_intent_capture(merchant=request.merchant, payment_intent=intent_id, **fields)))


@route(
    Operation(
        "POST",
        "Cancel a payment intent that is not yet confirmed, or whose authorization waits for capture (it is voided).",
        body=CANCEL,
        answers=ref("payment_intent"),
        errors={409: ("payment_intent_unexpected_state",)},
    )
)
def cancel(request: ApiRequest, intent_id: str) -> HttpResponse:
    fields = CANCEL.parse(request)
    return respond(render_intent(payment_intent_cancel(merchant=request.merchant, payment_intent=intent_id, **fields)))


@route(
    Operation(
        "POST",
        "Create a checkout session and its payment intent.",
        body=CREATE_SESSION,
        answers=ref("checkout.session"),
        errors=_PAYMENT_REFUSALS,
    )
)
def checkout_sessions(request: ApiRequest) -> HttpResponse:
    return respond(render_session(create_session(request.merchant, CREATE_SESSION.parse(request))))


@route(Operation("GET", "Retrieve a checkout session.", answers=ref("checkout.session")))
def checkout_session(request: ApiRequest, session_id: str) -> HttpResponse:
    found = owned(request, CheckoutSession.objects.select_related("intent"), session_id, "checkout.session")
    return respond(render_session(found))


# --- rail callbacks --------------------------------------------------------------------

CALLBACK_MAX_BYTES = 16 * 1024
# A callback only makes the poll due now, and only when it is more than this far out: a
# rail's duplicate notifications cannot turn the ladder's first rungs into a hot loop.
PULL_FORWARD_FLOOR_SECONDS = 10.0


@csrf_exempt
@require_POST
def rail_callback(request: HttpRequest, code: str) -> HttpResponse:
    """A rail says something happened to a charge. Nothing in the body is believed: the
    reference only names which charge to ask about, and the poll asks the rail itself.
    Unknown references get the same quiet 200 as known ones (no oracle for guessing ids)."""
    if get_rail(code) is None:
        return error_response(404, "rail_unknown", "No rail by this name is configured.")
    too_big = error_response(413, "body_too_large", f"A callback body may be at most {CALLBACK_MAX_BYTES} bytes.")
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > CALLBACK_MAX_BYTES:
            return too_big
    except ValueError:
        return error_response(400, "invalid_request", "Content-Length is not a number.")
    # One byte past the cap from the stream, never request.body: that would buffer the
    # whole body (up to DATA_UPLOAD_MAX_MEMORY_SIZE) before the cap could refuse it.
    raw = request.read(CALLBACK_MAX_BYTES + 1)
    if len(raw) > CALLBACK_MAX_BYTES:
        return too_big
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return error_response(400, "invalid_json", "The callback body is not valid JSON.")
    reference = body.get("reference") if isinstance(body, dict) else None
    if not storable(reference):
        return error_response(
            400,
            "parameter_invalid",
            "reference may not contain NUL characters or unpaired surrogates.",
            param="reference",
        )
    if (
        isinstance(reference, str)
        and 0 < len(reference) <= ID_MAX_LENGTH
        and Charge.objects.filter(id=reference, rail=code, status__in=CHARGE_LIVE).exists()
    ):
        queue.pull_forward(repository.poll_dedupe_key(reference), floor=PULL_FORWARD_FLOOR_SECONDS)
    return JsonResponse({"received": True})
