"""``/v1/refunds``: create, retrieve and list refunds (charges/services/refunds.py)."""

from __future__ import annotations

from django.http import HttpResponse

from api.framework import ApiRequest, Body, Field, owned, respond, route
from api.ids import ID_MAX_LENGTH
from api.lists import paginate
from api.operations import Operation
from api.params import LIST, Param, takes_query
from api.schemas import list_of, ref
from charges.models import Refund
from charges.services.refunds import refund_create
from charges.states import RefundReason
from charges.views import AMOUNT_DESCRIPTION, AMOUNT_SCHEMA
from charges.wire import render_refund

CREATE_REFUND = Body(
    payment_intent=Field(str, required=True, max_length=ID_MAX_LENGTH),
    amount=Field(int, description=f"{AMOUNT_DESCRIPTION} Absent: all that is left.", schema=AMOUNT_SCHEMA),
    reason=Field(str, choices=RefundReason.values),
)

LIST_REFUNDS = LIST.extend(
    {"payment_intent": Param(str, "Only this payment intent's refunds.", max_length=ID_MAX_LENGTH)}
)


@route(
    Operation("GET", "List refunds, newest first.", query=LIST_REFUNDS, answers=list_of("refund")),
    Operation(
        "POST",
        "Refund a succeeded payment intent, all that is left unless amount says less.",
        body=CREATE_REFUND,
        answers=ref("refund"),
        errors={
            400: ("amount_too_large", "charge_already_refunded"),
            404: ("resource_missing",),
            409: ("payment_intent_unexpected_state", "rail_unknown"),
        },
    ),
)
@takes_query(LIST_REFUNDS)
def refunds(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        fields = CREATE_REFUND.parse(request)
        return respond(render_refund(refund_create(merchant=request.merchant, **fields)))
    queryset = Refund.objects.filter(merchant=request.merchant)
    if "payment_intent" in request.query:
        queryset = queryset.filter(intent_id=request.query["payment_intent"])
    return paginate(request, queryset, render_refund, request.query)


@route(Operation("GET", "Retrieve a refund.", answers=ref("refund")))
def refund(request: ApiRequest, refund_id: str) -> HttpResponse:
    return respond(render_refund(owned(request, Refund.objects.all(), refund_id, "refund")))
