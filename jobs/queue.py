"""Putting work on the queue.

Enqueue writes in the caller's transaction: a job exists if and only if the business
write that asked for it committed. ``run_at`` is ``now() + delay`` computed by PostgreSQL.
A live ``dedupe_key`` (or ``job_id``) makes a second enqueue a no-op. Idle workers are
woken by ``NOTIFY``, which PostgreSQL delivers at commit.

Every argument is validated before anything is written; a bad one raises
:class:`EnqueueError` (a ``ValueError``) naming it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction

from jobs import registry, repository
from jobs.kinds import JobKind
from jobs.schema import PayloadError

_MAX_NAME = 64
_MAX_LABEL = 128


class EnqueueError(ValueError):
    """A job could not be enqueued because an argument is invalid. Nothing was written."""


@dataclass(frozen=True)
class JobRequest:
    """One job for :func:`enqueue_many`; the fields mean what :func:`enqueue`'s arguments mean."""

    kind: JobKind | str
    payload: Mapping
    job_id: uuid.UUID | None = None
    dedupe_key: str | None = None
    delay: timedelta | float | None = None
    queue: str = "default"
    priority: int = 0
    tenant: str | None = None
    correlation_id: str | None = None
    max_attempts: int | None = None


def enqueue(
    kind: JobKind | str,
    payload: Mapping,
    *,
    job_id: uuid.UUID | None = None,
    dedupe_key: str | None = None,
    delay: timedelta | float | None = None,
    queue: str = "default",
    priority: int = 0,
    tenant: str | None = None,
    correlation_id: str | None = None,
    max_attempts: int | None = None,
) -> uuid.UUID | None:
    """Enqueue one job; returns its ``job_id``, or ``None`` if the dedupe key or job_id is live.

    ``priority``: lower runs first. ``delay``: seconds (or a timedelta) after now, on the
    database clock. ``max_attempts`` defaults to the kind's retry policy.
    """
    row = _validated(
        JobRequest(kind, payload, job_id, dedupe_key, delay, queue, priority, tenant, correlation_id, max_attempts)
    )
    inserted = repository.insert_job(**row)
    return row["job_id"] if inserted is not None else None


def enqueue_many(requests: Iterable[JobRequest]) -> int:
    """Enqueue many jobs in one statement; returns how many were new (dedupe skips the rest).

    All are validated first: one invalid request raises and nothing is written.
    """
    rows = [_validated(r) for r in requests]
    if not rows:
        return 0
    # One statement is already atomic; the block only keeps the NOTIFY with the insert
    # when the caller runs in autocommit.
    with transaction.atomic():
        return repository.insert_jobs(rows)


def pull_forward(dedupe_key: str, floor: timedelta | float = 0) -> bool:
    """Make the waiting job with ``dedupe_key`` due now, if it is due more than ``floor`` from now.

    Returns whether a job moved. A leased job is left alone: its worker will settle it.
    """
    return repository.pull_forward(dedupe_key, _seconds(floor, "floor"))


def _validated(r: JobRequest) -> dict:
    kind = r.kind.value if isinstance(r.kind, JobKind) else r.kind
    if kind not in JobKind.values:
        raise EnqueueError(f"unknown job kind {kind!r}")
    spec = registry.get(kind)
    if spec is None:
        raise EnqueueError(f"job kind {kind!r} has no registered handler")
    if not isinstance(r.payload, Mapping):
        raise EnqueueError(f"payload for {kind!r} must be a mapping, not {type(r.payload).__name__}")
    payload = dict(r.payload)
    try:
        spec.schema.validate(payload)
    except PayloadError as exc:
        raise EnqueueError(f"invalid payload for {kind!r}: {exc}") from None
    try:
        payload_json = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EnqueueError(f"payload for {kind!r} is not JSON-serializable: {exc}") from None
    if not isinstance(r.queue, str) or not r.queue or len(r.queue) > _MAX_NAME:
        raise EnqueueError(f"queue must be a non-empty string of at most {_MAX_NAME} characters")
    if not isinstance(r.priority, int) or isinstance(r.priority, bool) or not -32768 <= r.priority <= 32767:
        raise EnqueueError("priority must be an integer between -32768 and 32767")
    for name, value in (("tenant", r.tenant), ("correlation_id", r.correlation_id)):
        if value is not None and (not isinstance(value, str) or len(value) > _MAX_LABEL):
            raise EnqueueError(f"{name} must be a string of at most {_MAX_LABEL} characters")
    if r.dedupe_key is not None and (not isinstance(r.dedupe_key, str) or not r.dedupe_key):
        raise EnqueueError("dedupe_key must be a non-empty string")
    if r.job_id is not None and not isinstance(r.job_id, uuid.UUID):
        raise EnqueueError("job_id must be a uuid.UUID")
    max_attempts = r.max_attempts if r.max_attempts is not None else registry.retry_policy(spec).max_attempts
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise EnqueueError("max_attempts must be a positive integer")
    return {
        "job_id": r.job_id or uuid.uuid4(),
        "kind": kind,
        "queue": r.queue,
        "payload": payload_json,
        "priority": r.priority,
        "delay": _seconds(r.delay, "delay"),
        "max_attempts": max_attempts,
        "dedupe_key": r.dedupe_key,
        "correlation_id": r.correlation_id or "",
        "tenant": r.tenant or "",
    }


def _seconds(value: timedelta | float | None, name: str) -> float:
    if value is None:
        return 0.0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise EnqueueError(f"{name} must be a non-negative number of seconds or a timedelta")
    return float(seconds)
