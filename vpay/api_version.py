"""The versions of the ``/v1`` wire format, defined here once.

A client pins one with the ``Vpay-Version`` request header (``api.middleware`` echoes it,
``api.framework.route`` refuses one not listed); an event stores the version its object was
rendered in (``webhooks.events.emit``). A version is the date it was released.
"""

from __future__ import annotations

HEADER = "Vpay-Version"
CURRENT = "2026-12-01"
# Oldest first; a request without the header is served in CURRENT.
SUPPORTED: tuple[str, ...] = (CURRENT,)


def requested(headers) -> str | None:
    """The version a request asks for (``CURRENT`` without the header), or None when the
    header names no supported version (an empty value included)."""
    value = headers.get(HEADER)
    if value is None:
        return CURRENT
    return value if value in SUPPORTED else None
