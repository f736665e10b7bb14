"""Helpers the ops-console tests share: dead letters made on the database clock, staff users."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import Permission

from jobs.models import DeadLetter, db_ago


def make_letter(**fields) -> DeadLetter:
    """A pending dead letter of an application task (a registered kind), created now."""
    defaults = {
        "job_id": uuid.uuid4(),
        "kind": "task",
        "queue": "default",
        "payload": {"task": "tests.tasks.record", "args": ["replayed"], "kwargs": {}},
        "attempts": 5,
        "max_attempts": 5,
        "cause": "exhausted",
        "error_category": "transient",
        "last_error": "TransientError: the rail timed out\nsecond line of the traceback",
        "correlation_id": f"corr-{uuid.uuid4().hex[:8]}",
        "job_created_at": db_ago(minutes=10),
    }
    letter = DeadLetter.objects.create(**{**defaults, **fields})
    letter.refresh_from_db()
    return letter


def staff_user(django_user_model, username: str, *codenames: str):
    """A staff user holding exactly these ``jobs`` permissions."""
    user = django_user_model.objects.create_user(username=username, password="pw-" + username, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="jobs", codename=codename))
    return user


OPERATOR_PERMS = ("view_deadletter", "replay_deadletter", "discard_deadletter", "view_job", "cancel_job")
