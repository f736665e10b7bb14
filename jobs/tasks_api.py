"""The Django Tasks API of the installed Django: ``django.tasks`` on Django 6, the
``django-tasks`` backport on Django 5.2 (same names, but one exception renamed).

vpay supports both. The backend must subclass, build and recognise the classes of the API
that ``@task`` uses on this Django: on Django 6 a core ``django.tasks.task`` function is a
core ``Task``, which a backend written against the backport would enqueue but its worker
would refuse as "not a @task function". So everything in vpay (the backend, the tests, the
bench) imports the API from here, and nowhere names either package (tests/test_tasks_backend.py
checks that).
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

__all__ = [
    "IN_CORE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task",
    "task_enqueued",
]

# By availability, not by version number: the core module is the API wherever it exists.
# vpay/settings.py makes the same test to install the backport's app only where it is used.
IN_CORE = find_spec("django.tasks") is not None

# mypy reads the core API (django-stubs declares it whichever Django is installed), so the
# backend is type-checked against the API Django 6 ships; the backport's matches it.
if TYPE_CHECKING or IN_CORE:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, default_task_backend, task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json
else:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, default_task_backend, task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued
    from django_tasks.utils import normalize_json
