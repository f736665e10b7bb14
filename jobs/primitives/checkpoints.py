"""A running job's checkpoint: where an iterating handler got to, kept on its ``jobs`` row.

A handler that walks many items reads ``ctx.cursor`` (None on a fresh pass) and, after
each unit whose effects have committed, calls ``ctx.checkpoint(cursor)``. The cursor is
written with the lease's heartbeat in one statement (``jobs.storage.leases.heartbeat``), so the
next run of the job, whether after a crash (the reaper's rescue), a retry or a reschedule
(``more`` to do), starts from it. ``ctx.checkpoint(None)`` clears it: the next run starts
a new pass. A finished job's row, and its cursor, are gone.

The cursor is JSON (``DjangoJSONEncoder``: a datetime comes back as its ISO text), at most
:data:`MAX_BYTES`: it is a position, not a result set.

Loop-fenced kinds (``fenced=True``) are refused: their effects commit only with the
loop's transaction at the end of the body, so a cursor written beside them (on another
connection) would move past work a crash then rolls back, and one written inside would
not be visible until the end. Such a kind is one transaction; it has nothing to resume.
"""

from __future__ import annotations

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

MAX_BYTES = 2048


class CheckpointRefused(RuntimeError):
    """A checkpoint this job cannot keep (a loop-fenced kind, a cursor too big or not JSON)."""


def encode(cursor: object) -> str | None:
    """The cursor as JSON text for the heartbeat, or None to clear it."""
    if cursor is None:
        return None
    try:
        text = json.dumps(cursor, cls=DjangoJSONEncoder, separators=(",", ":"))
    except TypeError as exc:
        raise CheckpointRefused(f"a checkpoint must be JSON: {exc}") from exc
    if len(text.encode()) > MAX_BYTES:
        raise CheckpointRefused(f"a checkpoint is a position, at most {MAX_BYTES} bytes; this one is {len(text)}")
    return text


def decode(text: str) -> object:
    """What :func:`encode` wrote, as the handler will read it back after a crash."""
    return json.loads(text)


# The stored cursor of the job this lease runs (primary key, guarded on the lease token),
# read once per run, when the handler first asks for it.
_READ = "SELECT checkpoint FROM jobs WHERE id = %s AND lease_token = %s"


def stored(job_id: int, token) -> object:
    """The job's persisted cursor; None on a fresh pass (or when the lease is gone: the
    handler's next heartbeat says so)."""
    with connection.cursor() as cursor:
        cursor.execute(_READ, [job_id, token])
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return decode(row[0]) if isinstance(row[0], str) else row[0]
