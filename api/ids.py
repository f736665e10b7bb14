"""Kept so ``from api.ids import …`` keeps working: the ids moved to :mod:`vpay.ids`, which
every app may import without importing ``api`` (``merchants`` must not: ``api`` imports it)."""

from vpay.ids import ID_MAX_LENGTH, new_id

__all__ = ["ID_MAX_LENGTH", "new_id"]
