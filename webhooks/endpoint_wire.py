"""The wire form of a webhook endpoint: the API's answers and the ``webhook_endpoint.*`` events' object."""

from __future__ import annotations

from webhooks.models import WebhookEndpoint
from webhooks.services import endpoints


def render_endpoint(endpoint: WebhookEndpoint, *, secret: str | None = None) -> dict:
    """``secret`` only in the answer that created or rotated it (once); never in an event."""
    body = {
        "id": endpoint.id,
        "object": "webhook_endpoint",
        "url": endpoint.url,
        "enabled_events": list(endpoint.enabled_events),
        "description": endpoint.description,
        "created": int(endpoint.created_at.timestamp()),
        "active_secrets": endpoints.active_secret_count(endpoint),
        "status": "disabled" if endpoint.disabled_at is not None else "enabled",
        "disabled_reason": endpoint.disabled_reason or None,
    }
    if secret is not None:
        body["secret"] = secret
    return body
