"""Durations as operators read them."""

from __future__ import annotations

import re
from datetime import datetime

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
# The same units, for reading a duration an operator typed (``12h``, ``7d``).
SECONDS_PER_UNIT = dict(_UNITS)


def humanize_seconds(seconds: float | None) -> str:
    """The largest unit and the one after it: ``3d 4h``, ``12m 5s``, ``2h 0m``, ``7s``."""
    if seconds is None:
        return "-"
    seconds = max(int(seconds), 0)
    for i, (name, size) in enumerate(_UNITS):
        if seconds >= size or name == "s":
            text = f"{seconds // size}{name}"
            if i + 1 < len(_UNITS):
                next_name, next_size = _UNITS[i + 1]
                text += f" {seconds % size // next_size}{next_name}"
            return text
    raise AssertionError("unreachable")  # pragma: no cover


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_time_bound(text: str) -> tuple[float | None, datetime | None]:
    """A window's bound as an operator types it: a duration back from the database's now
    (``90s``, ``30m``, ``12h``, ``7d``) or an ISO-8601 instant with a timezone. Returns
    (seconds, None) or (None, instant); ValueError with a message for anything else."""
    match = _DURATION.match(text.strip())
    if match:
        return float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)], None
    try:
        instant = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r}: give a duration like 30m, 12h, 7d or an ISO-8601 time") from None
    if instant.tzinfo is None:
        raise ValueError(f"{text!r}: an ISO-8601 time needs a timezone (e.g. +00:00)")
    return None, instant
