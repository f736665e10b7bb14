"""Creating merchants, issuing keys and authenticating API requests."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import transaction

from api.framework import AUTHENTICATION, ApiError
from merchants.models import ApiKey, Merchant
from vpay.tokens import new_token


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _key_prefix() -> str:
    return "sk_live_" if settings.LIVE_MODE else "sk_test_"


@transaction.atomic
def create_merchant(name: str) -> tuple[Merchant, str]:
    """A new merchant and its first secret key. The key is returned once and never stored."""
    name = name.strip()
    if not name or len(name) > 200:
        raise ValueError("a merchant name is 1 to 200 characters")
    merchant = Merchant.objects.create(name=name)
    return merchant, issue_key(merchant)


def issue_key(merchant: Merchant) -> str:
    """A new secret key for ``merchant``; only its digest is kept."""
    key = new_token(_key_prefix(), bits=256)
    ApiKey.objects.create(merchant=merchant, digest=_digest(key), last4=key[-4:])
    return key


def authenticate(authorization: str) -> Merchant:
    """The merchant a ``Bearer sk_…`` header belongs to, or a 401 that repeats no key."""
    scheme, _, key = authorization.partition(" ")
    if not authorization:
        raise ApiError(
            401, "api_key_missing", "Provide your API key as 'Authorization: Bearer sk_…'.", type=AUTHENTICATION
        )
    if scheme.lower() != "bearer" or not key.strip().startswith("sk_"):
        raise ApiError(401, "api_key_invalid", "The Authorization header is not 'Bearer sk_…'.", type=AUTHENTICATION)
    found = (
        ApiKey.objects.select_related("merchant").filter(digest=_digest(key.strip()), revoked_at__isnull=True).first()
    )
    if found is None:
        raise ApiError(401, "api_key_invalid", "Invalid API key.", type=AUTHENTICATION)
    return found.merchant
