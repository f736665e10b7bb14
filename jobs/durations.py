"""Durations as operators read them."""

from __future__ import annotations

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
