"""Merchants and their secret keys: create, issue, roll (with an overlap) and revoke.

The only writers of ``merchants`` and ``merchant_api_keys``. They raise the domain errors
of :mod:`vpay.errors` and know nothing of HTTP. A key is returned once, when it is made,
and only its digest is stored. Every instant (an overlap's end, a revocation) is the
database clock's.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from merchants import credentials
from merchants.credentials import Kind
from merchants.models import ApiKey, Merchant
from vpay.admin_log import log_change
from vpay.errors import InvalidInput, InvalidState, NotFound
from vpay.tokens import new_token

logger = logging.getLogger(__name__)

REASON_MAX = 2000
MAX_OVERLAP_SECONDS = 30 * 24 * 3600


def clean_reason(reason: str | None) -> str:
    """A reason as stored: trimmed and bounded; blank refused."""
    cleaned = (reason or "").strip()[:REASON_MAX]
    if not cleaned:
        raise InvalidInput("reason_required", "A reason is required: it is recorded with the change.", param="reason")
    return cleaned


@transaction.atomic
def merchant_create(*, name: str) -> tuple[Merchant, str]:
    """A new merchant and its first secret key. The key is returned once and never stored."""
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidInput("name_invalid", "a merchant name is 1 to 200 characters", param="name")
    merchant = Merchant.objects.create(name=name)
    return merchant, api_key_issue(merchant=merchant)


def create_merchant(name: str) -> tuple[Merchant, str]:
    """:func:`merchant_create` under its former name, for existing callers."""
    return merchant_create(name=name)


def api_key_issue(*, merchant: Merchant) -> str:
    """A new secret key for ``merchant`` in this deployment's mode; only its digest is kept."""
    key = new_token(credentials.prefix(Kind.SECRET_KEY, live_mode=settings.LIVE_MODE), bits=256)
    ApiKey.objects.create(merchant=merchant, digest=credentials.digest(key), last4=key[-4:])
    return key


def _active() -> Q:
    """Keys that authenticate now (by the database clock)."""
    return Q(revoked_at__isnull=True) & (Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))


@transaction.atomic
def api_key_roll(*, merchant_id: str, overlap_seconds: int, reason: str, actor=None) -> tuple[ApiKey, str]:
    """Issue a new key for the merchant; its keys that work now keep working for
    ``overlap_seconds`` more (0: they stop at once), then stop. Returns the new key's row and
    the key itself, shown this once. ``actor`` (a user) is recorded on the merchant's History.

    A key already due to stop sooner keeps its earlier end: a roll never extends a key.
    """
    reason = clean_reason(reason)
    if not 0 <= overlap_seconds <= MAX_OVERLAP_SECONDS:
        raise InvalidInput(
            "overlap_invalid", f"The overlap is 0 to {MAX_OVERLAP_SECONDS} seconds (30 days).", param="overlap"
        )
    # The lock serialises two rolls of one merchant: each sees the other's new key as old.
    merchant = Merchant.objects.select_for_update().filter(id=merchant_id).first()
    if merchant is None:
        raise NotFound("merchant_missing", f"No such merchant: {merchant_id!r}.", param="merchant")
    end = Now() + timedelta(seconds=overlap_seconds)
    old = list(merchant.api_keys.filter(_active()).values_list("pk", "last4"))
    merchant.api_keys.filter(_active(), expires_at__isnull=True).update(expires_at=end)
    merchant.api_keys.filter(_active(), expires_at__gt=end).update(expires_at=end)
    key = api_key_issue(merchant=merchant)
    new = merchant.api_keys.get(digest=credentials.digest(key))
    olds = ", ".join(f"sk_…{last4}" for _, last4 in old) or "none"
    log_change(
        actor,
        Merchant,
        merchant.id,
        str(merchant),
        f"Rolled the secret key: new sk_…{new.last4}; old ({olds}) stop in {overlap_seconds} s. Reason: {reason}",
    )
    logger.info(
        "api key rolled",
        extra={
            "merchant": merchant.id,
            "new_key": new.pk,
            "old_keys": [pk for pk, _ in old],
            "overlap": overlap_seconds,
        },
    )
    return new, key


@transaction.atomic
def api_key_revoke(*, key_id: int, reason: str, actor=None) -> ApiKey:
    """Stop a key now, for good, recording why. A key already revoked is refused."""
    reason = clean_reason(reason)
    key = ApiKey.objects.select_for_update().select_related("merchant").filter(pk=key_id).first()
    if key is None:
        raise NotFound("api_key_missing", f"No such key: {key_id!r}.", param="key")
    if key.revoked_at is not None:
        raise InvalidState("api_key_revoked", f"sk_…{key.last4} is already revoked.", param="key")
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=Now(), revoked_reason=reason)
    key.refresh_from_db()
    log_change(actor, Merchant, key.merchant_id, str(key.merchant), f"Revoked sk_…{key.last4}. Reason: {reason}")
    logger.info("api key revoked", extra={"merchant": key.merchant_id, "key": key.pk})
    return key
