"""The admin's History page, written by services: an operator's action recorded as a
``LogEntry`` on the object it changed, in the caller's transaction."""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType


def log_change(actor, model, object_id, object_repr: str, message: str) -> None:
    """Record ``message`` on the object's History page as done by ``actor`` (a user or a
    user's id); a no-op for an actor that is not a saved user (a command, a test)."""
    user_id = actor if isinstance(actor, int) else getattr(actor, "pk", None)
    if user_id is None:
        return
    LogEntry.objects.create(
        user_id=user_id,
        content_type_id=ContentType.objects.get_for_model(model).pk,
        object_id=str(object_id),
        object_repr=object_repr[:200],
        action_flag=CHANGE,
        change_message=message[:2000],
    )
