"""``Idempotency-Key`` on POST: the SQL of the ``api_idempotency_records`` table.

Only successful (2xx) answers are stored. A refused request wrote nothing, so a client
that corrects its body may reuse the key; a stored answer is replayed byte for byte for
24 hours and a different request under the same key is a 409. Every age here is computed
by Postgres (``now() - created_at``), never by this host's clock.

Stored answers are sealed (``vpay.sealing``, ``VPAY_SECRETS_KEY``), because some carry a
secret that is shown once — a webhook endpoint's ``whsec_…``, a checkout session's client
secret — and a replay must hand the retrying client the same answer without keeping that
secret in plain text at rest. Each is bound to its record's merchant and key, so an answer
copied into another merchant's record (or under another key) does not open there.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from django.db import connection

from jobs.maintenance.housekeeping import StepResult, delete_in_rounds
from jobs.runner.context import JobContext
from vpay import sealing

TTL_SQL = "interval '24 hours'"
SWEEP_PAGE = 1000
MAX_SWEEP_PAGES = 50


class AnswerUnreadable(Exception):
    """A stored answer no configured key opens (the key was rotated away)."""


def _binding(merchant_id: str, key: str) -> sealing.Binding:
    # A record's identity is its (merchant_id, key): ON CONFLICT reuses the row under them.
    return sealing.bound("api_idempotency_records", "body", merchant_id, key)


def _seal(merchant_id: str, key: str, body: bytes) -> bytes:
    return sealing.seal_bytes(body, _binding(merchant_id, key))


def _open(merchant_id: str, key: str, sealed: bytes) -> bytes:
    try:
        return sealing.open_bytes(sealed, _binding(merchant_id, key))
    except sealing.Unreadable:
        raise AnswerUnreadable("a stored idempotent answer cannot be opened with the configured keys") from None


class Stored(NamedTuple):
    request_hash: str
    status_code: int
    body: bytes


def request_hash(method: str, path: str, body: bytes) -> str:
    """What a key is bound to: the method, the path and the exact body bytes."""
    digest = hashlib.sha256()
    digest.update(f"{method} {path}\n".encode())
    digest.update(body)
    return digest.hexdigest()


def lookup(merchant_id: str, key: str) -> Stored | None:
    """The live record under ``key`` for this merchant, if any."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT request_hash, status_code, body FROM api_idempotency_records"
            f" WHERE merchant_id = %s AND key = %s AND created_at > now() - {TTL_SQL}",
            [merchant_id, key],
        )
        row = cursor.fetchone()
    return Stored(row[0], row[1], _open(merchant_id, key, bytes(row[2]))) if row else None


def store(merchant_id: str, key: str, hashed: str, status_code: int, body: bytes) -> bool:
    """Record an answer; ``False`` when a live record under the key already exists.

    A concurrent request with the same key blocks on the unique index until the first one
    commits, then finds its row: the caller rolls back and replays that answer. An expired
    record the sweep has not removed yet is overwritten.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO api_idempotency_records (merchant_id, key, request_hash, status_code, body, created_at)"
            " VALUES (%s, %s, %s, %s, %s, now())"
            " ON CONFLICT (merchant_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash,"
            " status_code = EXCLUDED.status_code, body = EXCLUDED.body, created_at = EXCLUDED.created_at"
            f" WHERE api_idempotency_records.created_at <= now() - {TTL_SQL}"
            " RETURNING 1",
            [merchant_id, key, hashed, status_code, _seal(merchant_id, key, body)],
        )
        return cursor.fetchone() is not None


def sweep_expired_records(ctx: JobContext) -> StepResult:
    """Sweep step: delete expired records in pages, each page its own statement."""
    return delete_in_rounds(ctx, _delete_expired_records, page=SWEEP_PAGE, rounds=MAX_SWEEP_PAGES)


def _delete_expired_records(page: int) -> int:
    with connection.cursor() as cursor:
        # A page of the oldest expired records (index api_idempotency_created). The age
        # guard is repeated on the outer DELETE on purpose: a key reused after 24 hours
        # is re-stored in place (``store``'s ON CONFLICT DO UPDATE), and a DELETE that
        # picked the row while it was expired waits for that update's commit and then
        # re-checks only its own WHERE on the new row version, never the subquery's.
        # Without the repeat it deletes the fresh record, and the retried request runs twice.
        cursor.execute(
            "DELETE FROM api_idempotency_records WHERE id IN (SELECT id FROM api_idempotency_records"
            f" WHERE created_at <= now() - {TTL_SQL} ORDER BY created_at LIMIT %s)"
            f" AND created_at <= now() - {TTL_SQL}",
            [page],
        )
        return cursor.rowcount
