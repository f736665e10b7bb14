"""Whether a client's text can be stored: the one rule ``api.framework`` applies to every
body field, query value and path id before a view sees it, so the database never fails
on them (a 500) and a client gets a 400 or 404 that says why."""

from __future__ import annotations

from typing import Any


def _storable_text(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable(value: Any) -> bool:
    """Whether every string in ``value`` (keys too) is text PostgreSQL can store: no NUL,
    no unpaired surrogate (JSON's escapes let a client send both).

    Walked with a list, not by recursion: a body nested as deep as the JSON parser allows
    would otherwise end in a RecursionError here (a 500)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if not _storable_text(item):
                return False
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return True
