"""Whether a configured address is one a payer or a client elsewhere can reach: live mode
refuses the development defaults of ``VPAY_PUBLIC_URL`` and ``VPAY_CHECKOUT_BASE_URL``
(``vpay/settings.py``). Imported by the settings, so it imports nothing of Django's."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def public_https_url(url: str) -> bool:
    """An ``https://`` URL whose host is not this machine: not loopback, not the unspecified
    address, not ``localhost`` (nor a name under it, which resolvers keep local)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
    except ValueError:
        return False
    host = (parts.hostname or "").rstrip(".").lower()
    if parts.scheme != "https" or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True  # a name: what it resolves to is the operator's DNS
    return not (address.is_loopback or address.is_unspecified)
