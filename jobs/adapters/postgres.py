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
import math
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import NamedTuple

from django.db import transaction

from jobs import registry
from jobs.kinds import JobKind
from jobs.primitives.schema import PayloadError
from jobs.storage import held_sql, pull_forward_sql, repository

_MAX_NAME = 64
_MAX_LABEL = 128
_MAX_DEDUPE_KEY = 512  # well under a btree entry's limit


class EnqueueError(ValueError):
    """A job could not be enqueued because an argument is invalid. Nothing was written."""


class JobRequest(NamedTuple):
    """One job for :func:`enqueue_many`; the fields mean what :func:`enqueue`'s arguments mean.

    A NamedTuple rather than a dataclass: callers build thousands of these per bulk call.
    """

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
        JobRequest(kind, payload, job_id, dedupe_key, delay, queue, priority, tenant, correlation_id, max_attempts),
        {},
    )
    fresh = job_id is None
    if fresh:
        job_id = uuid.uuid4()
        row = (job_id, *row[1:])
    inserted = repository.insert_job(row, may_conflict=not fresh)
    return job_id if inserted is not None else None


def enqueue_many(requests: Iterable[JobRequest]) -> int:
    """Enqueue many jobs in one statement; returns how many were new (dedupe skips the rest).

    All are validated first: one invalid request raises and nothing is written. Jobs
    without a ``job_id`` get a fresh one. When no job carries a ``dedupe_key``, a
    ``job_id`` or a delay, the statement is a ``COPY`` (the fast path); otherwise one
    ``INSERT … SELECT … ON CONFLICT DO NOTHING``. Either way one ``NOTIFY`` per queue is
    delivered at commit.
    """
    if not isinstance(requests, list | tuple):
        requests = list(requests)
    if not requests:
        return 0
    kinds: dict[str, tuple[registry.KindSpec, int]] = {}
    if all(r.job_id is None and r.dedupe_key is None and not r.delay for r in requests):
        return _copy_many(requests, kinds)
    rows = [_validated(request, kinds, encode=False) for request in requests]
    may_conflict = any(r[0] is not None or r[7] is not None for r in rows)
    rows = [(str(r[0]) if r[0] is not None else None, *r[1:]) for r in rows]
    rows_json = _encode(rows, "the batch")
    # No savepoint inside a caller's transaction: two round trips for one statement, and no
    # caller goes on after a failed enqueue (its transaction is marked for rollback instead).
    with transaction.atomic(savepoint=False):
        return repository.insert_jobs(rows_json, may_conflict=may_conflict)


def _copy_many(requests: Sequence[JobRequest], kinds: dict) -> int:
    """The ``COPY`` path of :func:`enqueue_many`: due jobs with fresh ids and no dedupe key."""
    # Validated and encoded before the transaction opens: a bad request writes nothing. Each
    # row is kept as a tuple of str and int only, which the garbage collector stops tracking
    # at its first pass: 10,000 tuples still holding their payload dicts would be promoted
    # to the oldest generation and set off a full collection (≈50 ms in a Django process).
    encode = _batch_encoder()
    rows = []
    for request in requests:
        r = _validated(request, kinds, encode=False)
        rows.append((r[1], r[2], encode(r[3], r[1]), r[4], r[6], r[8], r[9]))
    # job_ids from Python: on a small machine the server's CPU is the scarcer one.
    job_ids = _uuid4_texts(len(rows))
    with transaction.atomic(savepoint=False):  # as enqueue_many's INSERT
        return repository.copy_jobs((job_id, *row) for job_id, row in zip(job_ids, rows, strict=True))


def pull_forward(dedupe_key: str, floor: timedelta | float = 0) -> bool:
    """Make the waiting job with ``dedupe_key`` due now, if it is due more than ``floor`` from now.

    A leased (running) job is woken instead, when ``floor`` is 0: if its handler answers a
    plain reschedule (not a failure, not a deferral), it is due at once rather than after
    the delay it asked for; whatever changed while it ran is looked at now. A floor guards
    against callers that may call often (a rail's notifications), so it never wakes a
    running job. Returns whether a job moved or was woken.
    """
    return pull_forward_sql.pull_forward(dedupe_key, _seconds(floor, "floor"))


def run_again(dedupe_key: str) -> bool:
    """Make the job with ``dedupe_key`` run after the caller's commit: a waiting one due now
    (held by no claim until that commit), a running one woken (it runs again once it settles,
    even when it finishes). False when there is none, or it was woken already."""
    return pull_forward_sql.run_again(dedupe_key)


def pull_forward_waiting(
    dedupe_keys: list[str], limit: int = 1, floor: timedelta | float = 0, *, deferred_only: bool = False
) -> list[str]:
    """:func:`pull_forward` for the first ``limit`` of ``dedupe_keys`` (in order) that are
    waiting and can be moved, in one statement; returns the names moved, in order.
    ``deferred_only``: only jobs whose last settle deferred them (a job waiting for its next
    rung after a run that made progress is left to its time)."""
    if not dedupe_keys or limit < 1:
        return []
    return pull_forward_sql.pull_forward_waiting(list(dedupe_keys), limit, _seconds(floor, "floor"), deferred_only)


class Held(NamedTuple):
    """Jobs :func:`hold_waiting` took: their names, in order, and the instant they are held
    until (the database's, as text), which :func:`settle_held` matches."""

    names: list[str]
    until: str


def hold_waiting(dedupe_keys: list[str], hold: timedelta | float) -> Held:
    """Take the named jobs that are waiting and due now off the queue for ``hold`` seconds,
    for a running handler that does their work alongside its own (webhook deliveries to one
    endpoint, a merchant's polls on one rail). A held job is not run, leased or counted: it
    only waits until the hold ends, when it runs on its own unless :func:`settle_held`
    finished or moved it first. Where the handler also claims their work (webhook attempts),
    call it in that transaction, so the hold and the claim commit together."""
    if not dedupe_keys:
        return Held([], "")
    return Held(*held_sql.hold_waiting(list(dedupe_keys), 0.0, _seconds(hold, "hold")))


def settle_held(settles: Iterable[tuple[str, timedelta | float | None]], held: Held) -> int:
    """Settle jobs ``held`` held as their own runs would have: ``(name, None)`` finished,
    ``(name, delay)`` due after ``delay`` seconds (attempts and deferrals reset, as after a
    run that made progress). A job that ran on its own or was moved since the hold (its
    ``run_at`` is no longer the hold's) is left to itself. Returns how many were settled."""
    rows = [(name, None if delay is None else _seconds(delay, "delay")) for name, delay in settles]
    return held_sql.settle_held(rows, held.until) if rows and held.until else 0


def validated(request: JobRequest) -> tuple:
    """``request`` checked exactly as :func:`enqueue` checks it, as a row in
    :data:`jobs.storage.repository.BULK_COLUMNS` order with its payload as JSON text, or
    :class:`EnqueueError`. Nothing is written (the in-process adapter's admission)."""
    return _validated(request, {})


_KINDS = frozenset(JobKind.values)


def _kind(kind: JobKind | str, cache: dict) -> tuple[str, registry.KindSpec, int]:
    name = kind.value if isinstance(kind, JobKind) else kind
    known = cache.get(name)
    if known is None:
        if name not in _KINDS:
            raise EnqueueError(f"unknown job kind {name!r}")
        spec = registry.get(name)
        if spec is None:
            raise EnqueueError(f"job kind {name!r} has no registered handler")
        known = cache[name] = (spec, registry.retry_policy(spec).max_attempts)
    return (name, *known)


def _validated(r: JobRequest, cache: dict, *, encode: bool = True) -> tuple:
    """The request as a row in :data:`jobs.storage.repository.BULK_COLUMNS` order, or EnqueueError.

    With ``encode`` the payload is returned as JSON text (checked serializable here);
    without, as the mapping itself, for a caller that encodes many rows at once.
    """
    kind, spec, default_max_attempts = _kind(r.kind, cache)
    payload: Mapping | str = r.payload  # str once encoded
    if not isinstance(payload, dict):
        if not isinstance(payload, Mapping):
            raise EnqueueError(f"payload for {kind!r} must be a mapping, not {type(payload).__name__}")
        payload = dict(payload)
    try:
        spec.schema.validate(payload)
    except PayloadError as exc:
        raise EnqueueError(f"invalid payload for {kind!r}: {exc}") from None
    if encode:
        payload = _encode(payload, kind)
    queue, priority = r.queue, r.priority
    if (
        queue == "default"
        and type(priority) is int
        and priority == 0
        and r.job_id is None
        and r.dedupe_key is None
        and r.delay is None
        and r.tenant is None
        and r.correlation_id is None
        and r.max_attempts is None
    ):
        # Every option at its default (most bulk requests): nothing else to check.
        return (None, kind, "default", payload, 0, 0.0, default_max_attempts, None, "", "")
    if not isinstance(queue, str) or not queue or len(queue) > _MAX_NAME:
        raise EnqueueError(f"queue must be a non-empty string of at most {_MAX_NAME} characters")
    if type(priority) is not int or not -32768 <= priority <= 32767:
        raise EnqueueError("priority must be an integer between -32768 and 32767")
    if r.tenant is not None and (not isinstance(r.tenant, str) or len(r.tenant) > _MAX_LABEL):
        raise EnqueueError(f"tenant must be a string of at most {_MAX_LABEL} characters")
    if r.correlation_id is not None and (not isinstance(r.correlation_id, str) or len(r.correlation_id) > _MAX_LABEL):
        raise EnqueueError(f"correlation_id must be a string of at most {_MAX_LABEL} characters")
    for name, value in (("queue", queue), ("tenant", r.tenant), ("correlation_id", r.correlation_id)):
        if value and "\x00" in value:  # PostgreSQL text cannot hold NUL
            raise EnqueueError(f"{name} contains a NUL character")
    if r.dedupe_key is not None and (
        not isinstance(r.dedupe_key, str) or not r.dedupe_key or len(r.dedupe_key) > _MAX_DEDUPE_KEY
    ):
        raise EnqueueError(f"dedupe_key must be a non-empty string of at most {_MAX_DEDUPE_KEY} characters")
    if r.dedupe_key is not None and "\x00" in r.dedupe_key:
        raise EnqueueError("dedupe_key contains a NUL character")
    if r.job_id is not None and not isinstance(r.job_id, uuid.UUID):
        raise EnqueueError("job_id must be a uuid.UUID")
    max_attempts = default_max_attempts if r.max_attempts is None else r.max_attempts
    if type(max_attempts) is not int or max_attempts < 1:
        raise EnqueueError("max_attempts must be a positive integer")
    delay = 0.0 if r.delay is None else _seconds(r.delay, "delay")
    return (
        r.job_id,
        kind,
        queue,
        payload,
        priority,
        delay,
        max_attempts,
        r.dedupe_key,
        r.correlation_id or "",
        r.tenant or "",
    )


def _uuid4_texts(n: int) -> list[str]:
    """``n`` random version-4 UUIDs as 32-digit hex text (PostgreSQL's uuid input takes it).

    The same as ``str(uuid.uuid4())`` for each, from one ``os.urandom`` call: a bulk
    enqueue would otherwise spend a system call and a UUID object per row.
    """
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes((b & 0x0F) | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes((b & 0x3F) | 0x80 for b in raw[8::16])  # RFC 4122 variant
    text = raw.hex()
    return [text[i : i + 32] for i in range(0, 32 * n, 32)]


# One encoder for every payload: json.dumps(..., allow_nan=False) builds a new one per call.
_to_json = json.JSONEncoder(allow_nan=False).encode


def _encode(payload: Mapping | list, kind: str, to_json=_to_json) -> str:
    """The payload (or a batch of rows) as JSON text PostgreSQL accepts, or EnqueueError."""
    try:
        text = to_json(payload)
    except (TypeError, ValueError) as exc:
        raise EnqueueError(f"payload for {kind!r} is not JSON-serializable: {exc}") from None
    if "\\u0000" in text:  # jsonb cannot store NUL; refuse it here, not as a database error
        raise EnqueueError(f"payload for {kind!r} contains a NUL character (\\u0000)")
    return text


def _batch_encoder():
    """``_encode`` for one bulk call, on one instance of ``json``'s C encoder.

    ``JSONEncoder.encode`` builds that C encoder anew for every payload, which is half of
    its cost on a small payload. Its arguments are the ones ``JSONEncoder.iterencode``
    passes (a fresh ``markers`` dict keeps circular references refused); where the C
    accelerator is missing or differs, the standard encoder is used.
    """
    try:
        one_shot = json.encoder.c_make_encoder(  # type: ignore[attr-defined]  # CPython's C accelerator, absent from typeshed
            {}, _not_serializable, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, False
        )
    except TypeError:  # no C accelerator (c_make_encoder is None), or another signature
        return _encode

    def to_json(payload) -> str:
        return "".join(one_shot(payload, 0))

    return lambda payload, kind: _encode(payload, kind, to_json)


def _not_serializable(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _seconds(value: timedelta | float | None, name: str) -> float:
    if value is None:
        return 0.0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        raise EnqueueError(f"{name} must be a non-negative number of seconds or a timedelta")
    return float(seconds)
