"""Application tasks the test suite enqueues through the Django Tasks API.

They are ordinary ``@task`` functions in an importable module, exactly what an
application writes; the worker (in-process or a real ``runworker`` subprocess) imports
and runs them. Effects go to the ``test_effects`` table (created by the ``effects``
fixture), inside the task's own transaction, which is the fence's transaction.
"""

from __future__ import annotations

import os
import time

from django.db import connection
from django_tasks import task

from vpay.errors import DeferError, PermanentError, TransientError


def _record(label: str, value: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_effects (label, value) VALUES (%s, %s)", [label, value])


@task
def record(label: str, value: str = "") -> None:
    """One row in test_effects per successful run: the observable effect."""
    _record(label, value)


@task
def record_slowly(label: str, seconds: float) -> None:
    time.sleep(seconds)
    _record(label)


@task
def record_then_crash(label: str) -> None:
    """Writes its effect, then fails before commit: the fence must roll back with it."""
    _record(label)
    raise TransientError("induced failure after the effect, before commit")


@task
def fail_transiently(label: str) -> None:
    raise TransientError(f"transient failure for {label}")


@task
def fail_permanently(label: str) -> None:
    raise PermanentError(f"the far side refused {label} for good")


@task
def defer(label: str, seconds: float = 0.0) -> None:
    raise DeferError(f"breaker open for {label}", delay_seconds=seconds)


@task
def noop() -> None:
    """The benchmark's no-op."""


@task
def record_pid(label: str) -> None:
    _record(label, str(os.getpid()))
