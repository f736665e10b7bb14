"""``/v1/events``: the outbox, readable by the merchant it belongs to."""

from django.http import HttpRequest, HttpResponse

from api.framework import ApiError, not_found, paginate, respond, route
from webhooks.event_types import EventType
from webhooks.events import render_event
from webhooks.models import Event


@route("GET")
def events(request: HttpRequest) -> HttpResponse:
    """List events, newest first; ``?type=`` filters by one event type."""
    queryset = Event.objects.filter(merchant=request.merchant)
    wanted = request.GET.get("type")
    if wanted is not None:
        if wanted not in EventType.values:
            raise ApiError(400, "parameter_invalid", f"Unknown event type: {wanted!r}.", param="type")
        queryset = queryset.filter(type=wanted)
    return paginate(request, queryset, render_event, "type")


@route("GET")
def event(request: HttpRequest, event_id: str) -> HttpResponse:
    found = Event.objects.filter(merchant=request.merchant, id=event_id).first()
    if found is None:
        raise not_found("event", event_id)
    return respond(render_event(found))
