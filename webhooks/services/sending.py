"""Step 2 of a delivery attempt (``webhooks/services/delivery.py``): render the event once,
hash it and compare the digest with the one stored by the first attempt that may have sent
it, sign it with every active secret, vet the address (SSRF guard) and POST it over a
connection pinned to the vetted address. Nothing here writes to the database except the
alert of a changed body; it never raises for the network."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import transaction

from jobs.operator.alerts import Severity, admin_path, raise_alert
from vpay.errors import error_chain
from webhooks import attempt_errors, attempt_sql, sealing, ssrf
from webhooks.decisions import AttemptResult, attempt_result
from webhooks.models import AttemptState, DeliveryState, Event, WebhookDelivery
from webhooks.services import transport
from webhooks.signing import HEADER, signature_header

logger = logging.getLogger("webhooks.delivery")


@dataclass
class Attempted:
    """What :func:`perform` found out; :func:`record` writes it."""

    attempt_state: AttemptState
    delivery_state: DeliveryState | None = None  # set for a refusal (decided before sending)
    status_code: int | None = None
    excerpt: str = ""
    # What the merchant reads (webhooks.attempt_errors: a fixed phrase, nothing about vpay's
    # network); ``detail`` is the full account, for the operators' log line and alert only.
    error: str = ""
    detail: str = ""
    # The digest of a body that may have reached the receiver; None when nothing left the
    # process (unsigned, unresolved, refused, out of budget before the first byte): the
    # first stored digest is what every later attempt is compared with, so it must be of
    # a body a receiver may have seen.
    payload_sha256: str | None = None
    duration_ms: int | None = None
    connected_to: tuple[str, int] | None = None


def render_body(event: Event) -> bytes:
    """The exact bytes sent: the event rendered by the renderer ``GET /v1/events`` uses."""
    from webhooks.events import render_event

    return json.dumps(render_event(event), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def perform(
    lease: attempt_sql.Lease,
    *,
    resolver: ssrf.Resolver = ssrf.system_resolver,
    loaded: attempt_sql.Loaded | None = None,
) -> Attempted:
    """Step 2: render, hash, sign, vet, POST. Never raises for the network or the receiver.

    ``loaded``: the delivery as ``delivery.load`` read it before the claim (read now otherwise)."""
    delivery = loaded if loaded is not None else attempt_sql.load_delivery(lease.delivery_id)
    if delivery is None:
        return Attempted(AttemptState.FAILED, error="the delivery is gone; nothing sent")
    if delivery.endpoint_deleted:
        return Attempted(
            AttemptState.FAILED, delivery_state=DeliveryState.CANCELLED, error="the endpoint was deleted; nothing sent"
        )
    body = render_body(delivery.event)
    digest = hashlib.sha256(body).hexdigest()
    # The digest stored by the first attempt that may have sent a body, as read under the
    # delivery's row lock when this attempt was claimed (the lease), so a digest recorded by
    # an attempt that ended just before this claim is never missed.
    if lease.payload_sha256 is not None and lease.payload_sha256 != digest:
        # The renderer no longer produces what was signed before: sending would put a
        # different body under the same event id. Fail loudly instead.
        with transaction.atomic():
            raise_alert(
                key=f"webhook_body_changed:{delivery.id}",
                title=f"Webhook delivery {delivery.id}: the rendered body changed since its first sent attempt",
                source="webhooks.body_changed",
                severity=Severity.ERROR,
                details={
                    "delivery_id": delivery.id,
                    "event_id": delivery.event_id,
                    "endpoint_id": delivery.endpoint_id,
                },
                link=admin_path(WebhookDelivery(pk=delivery.id)),
                correlation_id=delivery.event_id,
            )
        return Attempted(AttemptState.FAILED, error="rendered body differs from the first sent attempt; not sent")
    secrets = []
    for sealed in delivery.sealed_secrets:
        try:
            secrets.append(sealing.open_sealed_cached(sealed, delivery.endpoint_id))
        except sealing.SecretUnreadable:
            logger.warning(
                "a webhook secret is unreadable with the configured keys", extra={"endpoint": delivery.endpoint_id}
            )
    if not secrets:
        # Never an unsigned send: a failed attempt on the ladder (a key fix heals it).
        return Attempted(AttemptState.FAILED, error="the endpoint has no usable signing secret; nothing sent")
    headers = {
        HEADER: signature_header(body, secrets, lease.timestamp),
        "Vpay-Event-Id": delivery.event_id,
        "Vpay-Delivery-Attempt": str(lease.number),
    }
    # One budget for the whole attempt, resolution included: a merchant's slow nameserver
    # must not hold an executor beyond VPAY_WEBHOOK_TIMEOUT.
    started = time.monotonic()
    deadline = started + settings.VPAY_WEBHOOK_TIMEOUT
    try:
        url = httpx.URL(delivery.endpoint_url)
        if url.scheme not in ("http", "https") or not url.host or (settings.LIVE_MODE and url.scheme != "https"):
            return Attempted(AttemptState.FAILED, error="the endpoint URL is not deliverable (https only in live mode)")
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = ssrf.vet(
            url.host,
            port,
            allow=settings.VPAY_WEBHOOK_ALLOW_CIDRS,
            resolver=resolver,
            timeout=min(settings.VPAY_WEBHOOK_CONNECT_TIMEOUT, settings.VPAY_WEBHOOK_TIMEOUT),
        )
    except ssrf.AddressRefused as exc:
        if exc.permanent:
            return Attempted(
                AttemptState.FAILED,
                delivery_state=DeliveryState.REFUSED,
                error=attempt_errors.REFUSED,
                detail=f"refused by the SSRF guard: {exc}",
            )
        return Attempted(
            AttemptState.NO_RESPONSE,
            error=attempt_errors.unresolved(exc),
            detail=error_chain(exc, 1000),
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    except httpx.InvalidURL as exc:
        return Attempted(AttemptState.FAILED, error=attempt_errors.INVALID_URL, detail=error_chain(exc, 1000))
    left = deadline - time.monotonic()
    if left <= 0:
        return Attempted(
            AttemptState.NO_RESPONSE,
            error="the attempt's total timeout elapsed while resolving the host; nothing sent",
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    answer = transport.post(
        str(url),
        body,
        headers,
        addresses=addresses,
        connect_timeout=settings.VPAY_WEBHOOK_CONNECT_TIMEOUT,
        total_timeout=left,
        keep=transport.kept_connections() if settings.VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS else None,
    )
    duration_ms = int((time.monotonic() - started) * 1000)
    result = attempt_result(answer.status_code)
    state = {
        AttemptResult.SUCCEEDED: AttemptState.SUCCEEDED,
        AttemptResult.FAILED: AttemptState.FAILED,
        AttemptResult.NO_RESPONSE: AttemptState.NO_RESPONSE,
    }[result]
    return Attempted(
        state,
        status_code=answer.status_code,
        excerpt=answer.excerpt,
        error=attempt_errors.transport(answer.error) if answer.error is not None else "",
        detail=error_chain(answer.error, 1000) if answer.error is not None else "",
        payload_sha256=digest if answer.sent else None,
        duration_ms=duration_ms,
        connected_to=answer.connected_to,
    )
