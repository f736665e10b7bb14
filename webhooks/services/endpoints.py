"""Webhook endpoints: create, update, delete, rotate the signing secret.

The plain secret exists only in the return value of :func:`create_endpoint` and
:func:`rotate_secret` (shown to the merchant once); it is sealed before it is written.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q
from django.db.models.functions import Now

from merchants.models import Merchant
from webhooks import metrics, repository, sealing, ssrf
from webhooks.event_types import EventType
from webhooks.models import WebhookEndpoint, WebhookSecret

logger = logging.getLogger("webhooks.endpoints")

WILDCARD = "*"
MAX_URL = 2048
MAX_ENABLED_EVENTS = 50
# Secrets signing at once (one ``v1`` each). Well under ``signing.MAX_SIGNATURES`` (32, what
# a receiver's verify() accepts): a header past that would fail every receiver's check.
MAX_ACTIVE_SECRETS = 10
# Live endpoints per merchant: it bounds the deliveries (and deliver jobs) one event's
# fan-out transaction creates.
MAX_ENDPOINTS = 16


def clean_url(url: str) -> str:
    """A deliverable endpoint URL, or ValueError saying why (never echoing credentials).

    http or https (https only in live mode), a host, no user:password part. An IP
    literal is judged by the SSRF table now; a hostname is judged at every delivery,
    when it is resolved.
    """
    url = url.strip()
    if len(url) > MAX_URL:
        raise ValueError(f"is longer than {MAX_URL} characters.")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise ValueError("is not a valid URL.") from None
    if parsed.scheme not in ("http", "https"):
        raise ValueError("must be an http or https URL.")
    if settings.LIVE_MODE and parsed.scheme != "https":
        raise ValueError("must be https in live mode.")
    if not parsed.host:
        raise ValueError("must name a host.")
    if parsed.userinfo:
        raise ValueError("must not carry credentials (user:password@).")
    try:
        literal = ipaddress.ip_address(parsed.host)
    except ValueError:
        return url
    verdict = ssrf.classify(literal, settings.VPAY_WEBHOOK_ALLOW_CIDRS)
    if not verdict.allowed:
        raise ValueError(f"points at a non-public address ({verdict.reason}).")
    return url


def clean_enabled_events(events: Iterable[str]) -> list[str]:
    """``["*"]`` or known event types, de-duplicated in the given order; ValueError otherwise."""
    seen: list[str] = []
    for name in events:
        if name != WILDCARD and name not in EventType.values:
            raise ValueError(f"unknown event type {name!r}.")
        if name not in seen:
            seen.append(name)
    if not seen:
        raise ValueError("needs at least one event type, or '*'.")
    if len(seen) > MAX_ENABLED_EVENTS:
        raise ValueError(f"at most {MAX_ENABLED_EVENTS} event types.")
    if WILDCARD in seen:
        return [WILDCARD]
    return seen


class EndpointLimitReached(Exception):
    """The merchant already has :data:`MAX_ENDPOINTS` live endpoints."""


@transaction.atomic
def create_endpoint(
    merchant: Merchant, *, url: str, enabled_events: list[str], description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its first signing secret (returned once, stored sealed).

    :class:`EndpointLimitReached` at :data:`MAX_ENDPOINTS` live endpoints. The merchant row
    is locked before counting, so two concurrent creates cannot both take the last place:
    the second waits, then counts the first's endpoint. ``FOR NO KEY UPDATE`` does not
    conflict with the key-share lock a foreign-key insert takes, so the merchant's other
    writes (intents, events, customers) do not wait on it."""
    url, enabled_events = clean_url(url), clean_enabled_events(enabled_events)
    list(Merchant.objects.select_for_update(no_key=True).filter(pk=merchant.pk).values_list("pk"))
    # webhook_endpoints_live (merchant_id WHERE deleted_at IS NULL) serves this count.
    if WebhookEndpoint.objects.filter(merchant=merchant, deleted_at__isnull=True).count() >= MAX_ENDPOINTS:
        raise EndpointLimitReached(merchant.pk)
    endpoint = WebhookEndpoint.objects.create(
        merchant=merchant,
        url=url,
        enabled_events=enabled_events,
        description=description,
    )
    secret = sealing.new_secret()
    WebhookSecret.objects.create(endpoint=endpoint, sealed=sealing.seal(secret, endpoint.pk))
    endpoint.refresh_from_db(fields=["created_at"])
    return endpoint, secret


@transaction.atomic
def update_endpoint(
    endpoint: WebhookEndpoint,
    *,
    url: str | None = None,
    enabled_events: list[str] | None = None,
    description: str | None = None,
) -> WebhookEndpoint:
    """Change what an endpoint receives (or where); deliveries already created are unchanged."""
    if url is not None:
        endpoint.url = clean_url(url)
    if enabled_events is not None:
        endpoint.enabled_events = clean_enabled_events(enabled_events)
    if description is not None:
        endpoint.description = description
    endpoint.save(update_fields=["url", "enabled_events", "description"])
    return endpoint


@transaction.atomic
def delete_endpoint(endpoint: WebhookEndpoint) -> int:
    """Stop delivering to the endpoint. Its rows stay as evidence; its secrets are dropped.

    Its ``pending`` deliveries end here, in the same transaction, as ``cancelled`` with a
    reason: the merchant chose this, so no ladder runs out and nobody is alerted. Returns
    how many were cancelled. (Deliveries are locked before the endpoint, the order every
    attempt takes them in, so a delete and an attempt never deadlock.)"""
    cancelled = repository.cancel_pending_for_endpoint(endpoint.pk)
    WebhookEndpoint.objects.filter(pk=endpoint.pk, deleted_at__isnull=True).update(deleted_at=_db_now())
    endpoint.secrets.all().delete()
    if cancelled:
        transaction.on_commit(lambda: metrics.DELIVERIES_FINISHED.labels(state="cancelled").inc(cancelled))
        logger.info(
            "endpoint deleted: its pending deliveries were cancelled",
            extra={"endpoint_id": endpoint.pk, "cancelled": cancelled},
        )
    return cancelled


class EndpointDeleted(Exception):
    """The endpoint was deleted (perhaps by a request that committed meanwhile)."""


class SecretsAtLimit(Exception):
    """A rotation with an overlap would leave more than :data:`MAX_ACTIVE_SECRETS` signing.

    ``next_expiry`` is when the soonest of them stops signing (None: none is due to)."""

    def __init__(self, next_expiry) -> None:
        super().__init__(f"{MAX_ACTIVE_SECRETS} secrets are signing")
        self.next_expiry = next_expiry


@transaction.atomic
def rotate_secret(endpoint: WebhookEndpoint, *, overlap_seconds: float | None = None) -> str:
    """A new secret (returned once). The current one keeps signing for the overlap window
    (``VPAY_WEBHOOK_SECRET_OVERLAP``, 24 h by default), computed by the database; 0 ends it now.

    :class:`EndpointDeleted` if the endpoint is deleted: the endpoint row is locked first, so
    a rotation racing a delete either finishes before it (and the delete drops the new
    secret) or sees it, and never leaves a live secret on a deleted endpoint.

    :class:`SecretsAtLimit` if :data:`MAX_ACTIVE_SECRETS` are signing and ``overlap`` is not
    0. Refused rather than retiring the oldest: a receiver mid-rotation may still hold only
    the oldest, and retiring it would fail its deliveries without a word. The count is
    taken under the endpoint's lock, so concurrent rotations cannot both pass it; a
    rotation with no overlap is always allowed (it leaves one secret: a leak's remedy)."""
    overlap = settings.VPAY_WEBHOOK_SECRET_OVERLAP if overlap_seconds is None else overlap_seconds
    if overlap < 0:
        raise ValueError("the overlap cannot be negative")
    if not list(
        WebhookEndpoint.objects.select_for_update().filter(pk=endpoint.pk, deleted_at__isnull=True).values_list("pk")
    ):
        raise EndpointDeleted(endpoint.pk)
    if overlap > 0:
        # The secrets signing now (webhook_secrets_endpoint index), judged on the database clock.
        signing = WebhookSecret.objects.filter(endpoint_id=endpoint.pk).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=Now())
        )
        if signing.count() >= MAX_ACTIVE_SECRETS:
            raise SecretsAtLimit(signing.aggregate(soonest=Min("expires_at"))["soonest"])
    repository.expire_current_secrets(endpoint.pk, overlap)
    secret = sealing.new_secret()
    WebhookSecret.objects.create(endpoint=endpoint, sealed=sealing.seal(secret, endpoint.pk))
    return secret


def active_secret_count(endpoint: WebhookEndpoint) -> int:
    return len(repository.active_sealed_secrets(endpoint.pk))


def _db_now():
    return Now()
