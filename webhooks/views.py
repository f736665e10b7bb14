"""``/v1/events`` (the outbox, readable by the merchant it belongs to) and ``/v1/webhook_endpoints``."""

from django.http import HttpRequest, HttpResponse

from api.framework import ApiError, Body, Field, owned, paginate, respond, route
from api.operations import Operation, Query
from api.schemas import list_of, ref
from webhooks.endpoint_wire import render_endpoint
from webhooks.event_types import EventType
from webhooks.events import render_event
from webhooks.models import Event, WebhookEndpoint
from webhooks.services import endpoint_health, endpoints

LIST_EVENTS = Query(type=Field(str, choices=EventType.values, description="Only events of this type."))


@route(Operation("GET", "List events, newest first.", query=LIST_EVENTS, answers=list_of("event")))
def events(request: HttpRequest) -> HttpResponse:
    """List events, newest first; ``?type=`` filters by one event type."""
    queryset = Event.objects.filter(merchant=request.merchant)
    filters = LIST_EVENTS.parse(request)
    if "type" in filters:
        queryset = queryset.filter(type=filters["type"])
    return paginate(request, queryset, render_event, *LIST_EVENTS.fields)


@route(Operation("GET", "Retrieve an event (kept 30 days).", answers=ref("event")))
def event(request: HttpRequest, event_id: str) -> HttpResponse:
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


LIST_ENDPOINTS = Query()
_LIMIT_REACHED = {409: ("webhook_endpoint_limit_reached",)}


def _owned_endpoint(request: HttpRequest, endpoint_id: str) -> WebhookEndpoint:
    return owned(request, WebhookEndpoint.objects.filter(deleted_at__isnull=True), endpoint_id, "webhook_endpoint")


@route(
    Operation(
        "GET", "List webhook endpoints, newest first.", query=LIST_ENDPOINTS, answers=list_of("webhook_endpoint")
    ),
    Operation(
        "POST",
        "Create a webhook endpoint; the answer carries its signing secret, once.",
        body=CREATE,
        answers=ref("webhook_endpoint"),
        errors=_LIMIT_REACHED,
    ),
)
def webhook_endpoints(request: HttpRequest) -> HttpResponse:
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
    return paginate(request, queryset, render_endpoint, *LIST_ENDPOINTS.fields)


@route(
    Operation("GET", "Retrieve a webhook endpoint.", answers=ref("webhook_endpoint")),
    Operation("POST", "Update a webhook endpoint.", body=UPDATE, answers=ref("webhook_endpoint")),
    Operation("DELETE", "Delete a webhook endpoint.", answers=ref("deleted_webhook_endpoint")),
)
def webhook_endpoint(request: HttpRequest, endpoint_id: str) -> HttpResponse:
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
def rotate_webhook_secret(request: HttpRequest, endpoint_id: str) -> HttpResponse:
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
def disable_webhook_endpoint(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    """Stop sending to the endpoint (``{"reason"?}``); its pending deliveries wait for
    ``/enable``. Emits ``webhook_endpoint.disabled`` to the merchant's other endpoints.
    Already disabled: answered as it is, nothing changes."""
    endpoint = _owned_endpoint(request, endpoint_id)
    reason = DISABLE.parse(request).get("reason", "").strip() or DISABLED_BY_MERCHANT_REASON
    endpoint_health.endpoint_disable(endpoint_id=endpoint.pk, reason=reason, actor=endpoint_health.DISABLED_BY_MERCHANT)
    return respond(render_endpoint(_owned_endpoint(request, endpoint_id)))


@route(Operation("POST", "Send to the endpoint again.", body=ENABLE, answers=ref("webhook_endpoint")))
def enable_webhook_endpoint(request: HttpRequest, endpoint_id: str) -> HttpResponse:
    """Send to the endpoint again; its pending deliveries resume now. Already enabled:
    answered as it is, nothing changes."""
    endpoint = _owned_endpoint(request, endpoint_id)
    ENABLE.parse(request)
    endpoint_health.endpoint_enable(endpoint_id=endpoint.pk, actor=endpoint_health.DISABLED_BY_MERCHANT)
    return respond(render_endpoint(_owned_endpoint(request, endpoint_id)))
