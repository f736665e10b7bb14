"""The queue as a port: how payment and webhook code put work on the queue.

One interface, two adapters chosen by ``VPAY_QUEUE_ADAPTER``:

* ``postgres`` (the default): :mod:`jobs.adapters.postgres`, a row in ``jobs`` written in the caller's
  transaction, worked by ``runworker``. Durable.
* ``inprocess``: :mod:`jobs.adapters.inprocess`, jobs run at commit in this process. Not durable;
  live mode refuses it.

The contract both keep (tests/test_queue_port.py runs it on each):

* every job has a deterministic name, its ``dedupe_key``: while a job of that name is
  live, enqueueing the name again is a no-op (returns ``None``; ``enqueue_many`` does not
  count it);
* a job enqueued in a transaction exists only if the transaction commits: it runs after
  the commit, never after a rollback;
* delivered at least once: a handler may run again after a failure (retried on its kind's
  policy), so its effect must be idempotent by the job's name or subject;
* ``pull_forward(name)`` makes the waiting job of that name due now, and wakes it if it is
  running (a plain reschedule or a finish it answers then runs it again at once; not a
  failure's retry, a deferral, a cancel, nor the finish of a fenced kind, whose job id is
  spent); ``enqueue_or_wake(kind, payload, dedupe_key=…)`` is that wake, or an enqueue when no
  job has the name;
  ``pull_forward_waiting(names, limit)`` moves the first ``limit`` of several names that
  are waiting (with ``deferred_only``, that are waiting because their last run deferred);
* ``hold_waiting(names, hold)`` takes those of several waiting, due jobs it can off the queue
  for ``hold`` seconds, for a running handler that does their work alongside its own (it may
  take none: the in-process adapter never does), and ``settle_held`` then finishes or
  reschedules each as its own run would have (not one that ran or moved since); a held job left
  unsettled runs when its hold ends.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Protocol

from django.conf import settings

from jobs.adapters import postgres as queue
from jobs.adapters.postgres import EnqueueError, Held, JobRequest
from jobs.kinds import JobKind

__all__ = [
    "EnqueueError",
    "JobRequest",
    "adapter",
    "enqueue",
    "enqueue_many",
    "enqueue_or_wake",
    "pull_forward",
    "use",
]

ADAPTERS = ("postgres", "inprocess")


class QueueAdapter(Protocol):
    name: str
    durable: bool

    def enqueue(
        self,
        kind: JobKind | str,
        payload: Mapping,
        *,
        dedupe_key: str,
        delay: timedelta | float | None = None,
        queue: str = "default",
        priority: int = 0,
        tenant: str | None = None,
        correlation_id: str | None = None,
        max_attempts: int | None = None,
    ) -> uuid.UUID | None: ...

    def enqueue_many(self, requests: Iterable[JobRequest]) -> int: ...

    def pull_forward(self, dedupe_key: str, floor: timedelta | float = 0) -> bool: ...

    def run_again(self, dedupe_key: str) -> bool: ...

    def pull_forward_waiting(
        self, dedupe_keys: list[str], limit: int = 1, floor: timedelta | float = 0, *, deferred_only: bool = False
    ) -> list[str]: ...

    def hold_waiting(self, dedupe_keys: list[str], hold: timedelta | float) -> Held: ...

    def settle_held(self, settles: Iterable[tuple[str, timedelta | float | None]], held: Held) -> int: ...


class PostgresQueue:
    """:mod:`jobs.adapters.postgres` exactly as it is, behind the port (a named job is required)."""

    name = "postgres"
    durable = True

    def enqueue(self, kind: JobKind | str, payload: Mapping, *, dedupe_key: str, **options) -> uuid.UUID | None:
        _named(dedupe_key)
        return queue.enqueue(kind, payload, dedupe_key=dedupe_key, **options)

    def enqueue_many(self, requests: Iterable[JobRequest]) -> int:
        requests = list(requests)
        for request in requests:
            _named(request.dedupe_key)
        return queue.enqueue_many(requests)

    def pull_forward(self, dedupe_key: str, floor: timedelta | float = 0) -> bool:
        return queue.pull_forward(dedupe_key, floor)

    def run_again(self, dedupe_key: str) -> bool:
        return queue.run_again(dedupe_key)

    def pull_forward_waiting(
        self, dedupe_keys: list[str], limit: int = 1, floor: timedelta | float = 0, *, deferred_only: bool = False
    ) -> list[str]:
        return queue.pull_forward_waiting(dedupe_keys, limit, floor, deferred_only=deferred_only)

    def hold_waiting(self, dedupe_keys: list[str], hold: timedelta | float) -> Held:
        return queue.hold_waiting(dedupe_keys, hold)

    def settle_held(self, settles: Iterable[tuple[str, timedelta | float | None]], held: Held) -> int:
        return queue.settle_held(settles, held)


def _named(dedupe_key: str | None) -> None:
    if not dedupe_key:
        raise EnqueueError("a job enqueued through the port needs a deterministic name (dedupe_key)")


_lock = threading.Lock()
_configured: QueueAdapter | None = None
_override: QueueAdapter | None = None


def adapter() -> QueueAdapter:
    """The adapter ``VPAY_QUEUE_ADAPTER`` names (one per process), or the one :func:`use` set."""
    global _configured
    if _override is not None:
        return _override
    if _configured is None:
        with _lock:
            if _configured is None:
                _configured = build(settings.VPAY_QUEUE_ADAPTER)
    return _configured


def build(name: str) -> QueueAdapter:
    if name == "postgres":
        return PostgresQueue()
    if name == "inprocess":
        from jobs.adapters.inprocess import InProcessQueue

        return InProcessQueue(singletons=True)  # the drain and sweeps live in this process too
    raise ValueError(f"VPAY_QUEUE_ADAPTER must be one of {', '.join(ADAPTERS)}, not {name!r}")


@contextlib.contextmanager
def use(chosen: QueueAdapter) -> Iterator[QueueAdapter]:
    """Route the port through ``chosen`` for the block, process-wide (embedding, the
    conformance suite): handlers running on other threads reach the same adapter."""
    global _override
    previous, _override = _override, chosen
    try:
        yield chosen
    finally:
        _override = previous


def enqueue(
    kind: JobKind | str,
    payload: Mapping,
    *,
    dedupe_key: str,
    delay: timedelta | float | None = None,
    queue: str = "default",
    priority: int = 0,
    tenant: str | None = None,
    correlation_id: str | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID | None:
    """Enqueue the job named ``dedupe_key``; its id, or ``None`` if that name is live.
    The arguments mean what :func:`jobs.adapters.postgres.enqueue`'s do."""
    return adapter().enqueue(
        kind,
        payload,
        dedupe_key=dedupe_key,
        delay=delay,
        queue=queue,
        priority=priority,
        tenant=tenant,
        correlation_id=correlation_id,
        max_attempts=max_attempts,
    )


def enqueue_or_wake(kind: JobKind | str, payload: Mapping, *, dedupe_key: str, tenant: str | None = None) -> None:
    """The job named ``dedupe_key`` runs after the caller's commit: a waiting one due now (one
    held by a carrier's batch taken back from it), a running one woken (it runs again once it
    settles, even when it finishes), and, with none, a new one enqueued. The wake goes first:
    its row lock makes a finish that comes meanwhile wait and see it, where an enqueue first
    would find the name taken and add nothing, and the finish would then delete the only job.
    Not kept: a wake whose running job then ends cancelled (a cancel request) or dead-lettered;
    the backstop scans find the work it was for."""
    if not adapter().run_again(dedupe_key):
        adapter().enqueue(kind, payload, dedupe_key=dedupe_key, tenant=tenant)


def enqueue_many(requests: Iterable[JobRequest]) -> int:
    """Enqueue named jobs (each request carries its ``dedupe_key``); how many were new."""
    return adapter().enqueue_many(requests)


def pull_forward(dedupe_key: str, floor: timedelta | float = 0) -> bool:
    """Make the waiting job named ``dedupe_key`` due now, if due more than ``floor`` from now."""
    return adapter().pull_forward(dedupe_key, floor)


def pull_forward_waiting(
    dedupe_keys: list[str], limit: int = 1, floor: timedelta | float = 0, *, deferred_only: bool = False
) -> list[str]:
    """Make the first ``limit`` of the waiting jobs named ``dedupe_keys`` (in order) that can
    move due now (``deferred_only``: only those whose last run deferred); returns their names,
    in order."""
    return adapter().pull_forward_waiting(dedupe_keys, limit, floor, deferred_only=deferred_only)


def hold_waiting(dedupe_keys: list[str], hold: timedelta | float) -> Held:
    """Hold the waiting, due jobs named ``dedupe_keys`` that can be taken, for ``hold``
    seconds; their names, in order (maybe none), and the hold's instant."""
    return adapter().hold_waiting(dedupe_keys, hold)


def settle_held(settles: Iterable[tuple[str, timedelta | float | None]], held: Held) -> int:
    """Finish (``None``) or reschedule (a delay) each job ``held`` holds, as its own run
    would have; one that ran or moved since is left alone."""
    return adapter().settle_held(settles, held)
