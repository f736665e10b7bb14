"""Helpers the ops-console tests share: staff users holding given permissions."""

from __future__ import annotations

from django.contrib.auth.models import Permission


def staff_user(django_user_model, username: str, *codenames: str):
    """A staff user holding exactly these ``jobs`` permissions."""
    user = django_user_model.objects.create_user(username=username, password="pw-" + username, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="jobs", codename=codename))
    return user


OPERATOR_PERMS = ("view_deadletter", "replay_deadletter", "discard_deadletter", "view_job", "cancel_job")
