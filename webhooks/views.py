"""``/v1/events`` (the outbox, readable by the merchant it belongs to), ``/v1/event_types`` and
``/v1/webhook_endpoints`` (with their test events, deliveries and a delivery's retry)."""

from django.conf import settings
from django.http import HttpResponse

from api.framework import ApiError, ApiRequest, Body, Field, not_found, owned, respond, route
from api.lists import paginate
from api.operations import Operation
from api.params import LIST, Param, Query, takes_query
from api.ratelimit import rate_limit_key
from api.schemas import list_of, ref
from webhooks.delivery_wire import deliveries_for_wire, delivery_lookup, render_delivery
from webhooks.endpoint_wire import render_endpoint
from webhooks.event_types import DESCRIPTIONS, EventType
from webhooks.events import render_event
from webhooks.models import DeliveryState, Event, WebhookDelivery, WebhookEndpoint
from webhooks.services import endpoint_health, endpoints
from webhooks.services.merchant_actions import webhook_delivery_retry, webhook_endpoint_test

LIST_EVENTS = LIST.extend(
    {
        "type": Param(str, "Only events of this type.", choices=EventType.values),
        "types[]": Param(
            str,
            "Only events of these types (repeat it).",
            repeated=True,
            max_items=len(EventType),
            choices=EventType.values,
        ),
    },
    exclusive=[("type", "types[]")],
)


@route(Operation("GET", "List events, newest first.", query=LIST_EVENTS, answers=list_of("event")))
@takes_query(LIST_EVENTS)
def events(request: ApiRequest) -> HttpResponse:
    """List events, newest first; ``?type=`` filters by one event type, ``?types[]=`` by several."""
    queryset = Event.objects.filter(merchant=request.merchant)
    if "type" in request.query:
        queryset = queryset.filter(type=request.query["type"])
    if "types[]" in request.query:
        queryset = queryset.filter(type__in=request.query["types[]"])
    return paginate(request, queryset, render_event, request.query)


@route(Operation("GET", "Retrieve an event (kept 30 days).", answers=ref("event")))
def event(request: ApiRequest, event_id: str) -> HttpResponse:
    return respond(render_event(owned(request, Event.objects, event_id, "event")))


# --- /v1/webhook_endpoints --------------------------------------------------------------


def _url(value: str) -> str:
    return endpoints.clean_url(value)


def _events(value: list) -> list:
    return endpoints.clean_enabled_events(value)


_URL = {"format": "uri"}
_URL_DOC = "An http or https URL (https in live mode) with a host and no user:password part."
# clean_enabled_events: known types or "*", at least one.
_EVENTS = {"minItems": 1, "items": {"type": "string", "enum": [endpoints.WILDCARD, *EventType.values]}}
CREATE = Body(
    url=Field(str, required=True, max_length=endpoints.MAX_URL, check=_url, description=_URL_DOC, schema=_URL),
    enabled_events=Field(list, required=True, items=str, check=_events, schema=_EVENTS),
    description=Field(str, max_length=500),
)
UPDATE = Body(
    url=Field(str, max_length=endpoints.MAX_URL, check=_url, description=_URL_DOC, schema=_URL),
    enabled_events=Field(list, items=str, check=_events, schema=_EVENTS),
    description=Field(str, max_length=500),
)


_LIMIT_REACHED = {409: ("webhook_endpoint_limit_reached",)}


def _owned_endpoint(request: ApiRequest, endpoint_id: str) -> WebhookEndpoint:
    return owned(request, WebhookEndpoint.objects.filter(deleted_at__isnull=True), endpoint_id, "webhook_endpoint")


@route(
    Operation(
        "GET", "List webhook endpoints, newest first.", query=LIST, answers=list_of("webhook_endpoint")
    ),
    Operation(
        "POST",
        "Create a webhook endpoint; the answer carries its signing secret, once.",
        body=CREATE,
        answers=ref("webhook_endpoint"),
        errors=_LIMIT_REACHED,
    ),
)
@takes_query(LIST)
def webhook_endpoints(request: ApiRequest) -> HttpResponse:
    """Create an endpoint (the answer carries its ``secret``, once), or list them."""
    if request.method == "POST":
        fields = CREATE.parse(request)
        try:
            endpoint, secret = endpoints.create_endpoint(request.merchant, **fields)
        except endpoints.EndpointLimitReached:
            raise ApiError(
                409,
                "webhook_endpoint_limit_reached",
                f"This account already has {endpoints.MAX_ENDPOINTS} webhook endpoints;"
                " delete one, or subscribe an existing one to more event types.",
            ) from None
        return respond(render_endpoint(endpoint, secret=secret))
    queryset = WebhookEndpoint.objects.filter(merchant=request.merchant, deleted_at__isnull=True)
    return paginate(request, queryset, render_endpoint, request.query)


@route(
    Operation("GET", "Retrieve a webhook endpoint.", answers=ref("webhook_endpoint")),
    Operation("POST", "Update a webhook endpoint.", body=UPDATE, answers=ref("webhook_endpoint")),
    Operation("DELETE", "Delete a webhook endpoint.", answers=ref("deleted_webhook_endpoint")),
)
def webhook_endpoint(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """Retrieve, update (``url``, ``enabled_events``, ``description``) or delete one endpoint."""
    endpoint = _owned_endpoint(request, endpoint_id)
    if request.method == "POST":
        return respond(render_endpoint(endpoints.update_endpoint(endpoint, **UPDATE.parse(request))))
    if request.method == "DELETE":
        endpoints.delete_endpoint(endpoint)
        return respond({"id": endpoint_id, "object": "webhook_endpoint", "deleted": True})
    return respond(render_endpoint(endpoint))


ROTATE = Body(overlap_seconds=Field(int, min_value=0, max_value=7 * 24 * 3600))


@route(
    Operation(
        "POST",
        "Rotate the signing secret; the answer carries the new one, once.",
        body=ROTATE,
        answers=ref("webhook_endpoint"),
        errors={409: ("webhook_secrets_at_limit",)},
    )
)
def rotate_webhook_secret(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """A new signing secret (in the answer, once). The old one keeps signing alongside it for
    ``overlap_seconds`` (default ``VPAY_WEBHOOK_SECRET_OVERLAP``, 24 h); 0 retires it now."""
    endpoint = _owned_endpoint(request, endpoint_id)
    fields = ROTATE.parse(request)
    try:
        secret = endpoints.rotate_secret(endpoint, overlap_seconds=fields.get("overlap_seconds"))
    except endpoints.EndpointDeleted:
        _owned_endpoint(request, endpoint_id)  # deleted meanwhile: this is now its 404
        raise
    except endpoints.SecretsAtLimit as exc:
        due = f" The next one stops signing at {exc.next_expiry:%Y-%m-%dT%H:%M:%SZ}." if exc.next_expiry else ""
        raise ApiError(
            409,
            "webhook_secrets_at_limit",
            f"This endpoint already has {endpoints.MAX_ACTIVE_SECRETS} secrets signing.{due}"
            " Rotate with overlap_seconds=0 to replace them all with one new secret, or wait.",
            param="overlap_seconds",
        ) from None
    return respond(render_endpoint(endpoint, secret=secret))


DISABLE = Body(reason=Field(str, max_length=endpoint_health.REASON_MAX))
DISABLED_BY_MERCHANT_REASON = "Disabled by the merchant."
ENABLE = Body()


@route(Operation("POST", "Stop sending to the endpoint.", body=DISABLE, answers=ref("webhook_endpoint")))
def disable_webhook_endpoint(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """Stop sending to the endpoint (``{"reason"?}``); its pending deliveries wait for
    ``/enable``. Emits ``webhook_endpoint.disabled`` to the merchant's other endpoints.
    Already disabled: answered as it is, nothing changes."""
    endpoint = _owned_endpoint(request, endpoint_id)
    reason = DISABLE.parse(request).get("reason", "").strip() or DISABLED_BY_MERCHANT_REASON
    endpoint_health.endpoint_disable(endpoint_id=endpoint.pk, reason=reason, actor=endpoint_health.DISABLED_BY_MERCHANT)
    return respond(render_endpoint(_owned_endpoint(request, endpoint_id)))


@route(Operation("POST", "Send to the endpoint again.", body=ENABLE, answers=ref("webhook_endpoint")))
def enable_webhook_endpoint(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """Send to the endpoint again; its pending deliveries resume now. Already enabled:
    answered as it is, nothing changes."""
    endpoint = _owned_endpoint(request, endpoint_id)
    ENABLE.parse(request)
    endpoint_health.endpoint_enable(endpoint_id=endpoint.pk, actor=endpoint_health.DISABLED_BY_MERCHANT)
    return respond(render_endpoint(_owned_endpoint(request, endpoint_id)))


# --- test events, deliveries and their retry ----------------------------------------------


def _delivery(delivery_id: int) -> HttpResponse:
    return respond(render_delivery(deliveries_for_wire(WebhookDelivery.objects.filter(pk=delivery_id)).get()))


@route(
    Operation(
        "POST",
        "Send a webhook_endpoint.test event to this endpoint only; answers its delivery.",
        body=Body(),
        answers=ref("webhook_delivery"),
        errors={404: ("resource_missing",), 409: ("webhook_endpoint_disabled",)},
    )
)
def send_test_event(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """Send a ``webhook_endpoint.test`` event to this endpoint only; answers its delivery."""
    Body().parse(request)
    # Each call is a delivery the workers must make: bounded per merchant. Counted inside
    # the view's transaction: a refused call (over the limit, a disabled endpoint) is not
    # counted, and one merchant's test calls queue on its row lock, not on anyone else's.
    rate_limit_key(
        key=f"webhook_test:{request.merchant.pk}",
        limit=settings.VPAY_WEBHOOK_TEST_RATE_LIMIT,
        window=settings.VPAY_WEBHOOK_TEST_RATE_LIMIT_WINDOW_SECONDS,
        what="for a merchant's webhook test events",
    )
    return _delivery(webhook_endpoint_test(merchant_id=request.merchant.pk, endpoint_id=endpoint_id))


LIST_DELIVERIES = LIST.extend({"state": Param(str, "Only deliveries in this state.", choices=DeliveryState.values)})


@route(
    Operation(
        "GET",
        "The endpoint's deliveries, newest first, each with its latest attempts.",
        query=LIST_DELIVERIES,
        answers=list_of("webhook_delivery"),
    )
)
@takes_query(LIST_DELIVERIES)
def webhook_deliveries(request: ApiRequest, endpoint_id: str) -> HttpResponse:
    """The endpoint's deliveries, newest first, each with its latest attempts."""
    endpoint = _owned_endpoint(request, endpoint_id)
    # webhook_deliveries_ep_created (endpoint_id, created_at DESC, id DESC) serves both
    # directions; a cursor (a random public_id) is found by webhook_deliveries_public_id.
    scope = WebhookDelivery.objects.filter(endpoint_id=endpoint.pk)
    queryset = scope
    if "state" in request.query:
        queryset = queryset.filter(state=request.query["state"])
    return paginate(
        request, deliveries_for_wire(queryset), render_delivery, request.query, scope=scope, cursor=delivery_lookup
    )


@route(
    Operation(
        "POST",
        "Send a finished delivery again now, with a fresh retry ladder; answers the delivery.",
        body=Body(),
        answers=ref("webhook_delivery"),
        errors={
            404: ("resource_missing",),
            409: ("webhook_delivery_in_progress", "webhook_delivery_not_retryable", "webhook_endpoint_disabled"),
        },
    )
)
def retry_webhook_delivery(request: ApiRequest, endpoint_id: str, delivery_id: str) -> HttpResponse:
    """Send a finished delivery again now, with a fresh retry ladder; answers the delivery."""
    Body().parse(request)
    if delivery_lookup(delivery_id) is None:
        raise not_found("webhook_delivery", delivery_id)
    return _delivery(
        webhook_delivery_retry(merchant_id=request.merchant.pk, endpoint_id=endpoint_id, public_id=delivery_id)
    )


EVENT_TYPES = Query({})


@route(Operation("GET", "Every event type vpay emits, with a line saying when.", answers=list_of("event_type")))
@takes_query(EVENT_TYPES)
def event_types(request: ApiRequest) -> HttpResponse:
    """Every event type vpay emits, with a line saying when."""
    data = [{"object": "event_type", "type": value, "description": DESCRIPTIONS[value]} for value in EventType.values]
    return respond({"object": "list", "url": request.path, "has_more": False, "data": data})
