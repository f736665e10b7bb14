"""Whether a client's text can be stored: the one rule ``api.framework`` applies to every
body field, query value and path id before a view sees it, so the database never fails
on them (a 500) and a client gets a 400 or 404 that says why."""

from __future__ import annotations

from typing import Any


def storable(value: Any) -> bool:
    """Whether every string in ``value`` (keys too) is text PostgreSQL can store: no NUL,
    no unpaired surrogate (JSON's escapes let a client send both)."""
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(storable(key) and storable(item) for key, item in value.items())
    if isinstance(value, list):
        return all(storable(item) for item in value)
    return True
