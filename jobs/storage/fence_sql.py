"""The exactly-once fence's SQL (``processed_jobs``): one row per processed job id, inserted
in the transaction of the job's effect (``jobs.primitives.fence``, ``jobs.runner.invoke``)
and deleted once its TTL has passed (``jobs.maintenance.housekeeping``). Batches of fenced
jobs that wrote nothing are finished by ``jobs.storage.repository.finish_many``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connection

from vpay.pipelined import execute_pipelined

_FENCE = """
INSERT INTO processed_jobs (job_id, kind, subject, processed_at, expires_at)
VALUES (%s, %s, %s, now(), now() + make_interval(secs => %s))
ON CONFLICT (job_id) DO NOTHING
RETURNING 1
"""


def insert_fence(job_id: uuid.UUID, kind: str, subject: str, ttl_seconds: float) -> bool:
    """True when this is the first time ``job_id`` is processed."""
    with connection.cursor() as cursor:
        cursor.execute(_FENCE, [job_id, kind, subject[:255], ttl_seconds])
        return cursor.fetchone() is not None


# The settle of fenced jobs (jobs.runner.worker): their fence rows and their deletes in one
# statement, inside the transaction that made their effects. A fence row that already
# exists (a concurrent run committed first) is not inserted, and the caller rolls back.
_FENCE_AND_FINISH = """
WITH fenced AS (
    INSERT INTO processed_jobs (job_id, kind, subject, processed_at, expires_at)
    SELECT f.job_id, f.kind, f.subject, now(), now() + make_interval(secs => %(ttl)s)
      FROM unnest(%(job_ids)s::uuid[], %(kinds)s::text[], %(subjects)s::text[]) AS f(job_id, kind, subject)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING 1
),
finished AS (
    DELETE FROM jobs j
     USING unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS s(id, token)
     WHERE j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS requested, j.cancel_requested_by, j.cancel_reason
)
SELECT (SELECT count(*) FROM fenced), (SELECT count(*) FROM finished),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(id, cancel_requested_by, cancel_reason)), '[]')
          FROM finished WHERE requested)
"""


def fence_and_finish(
    *, fences: Sequence[tuple[uuid.UUID, str, str]], leases: Sequence[tuple[int, uuid.UUID]], ttl_seconds: float
) -> tuple[int, int, list]:
    """Insert fence rows and delete leased jobs; returns (fence rows inserted, jobs deleted,
    [id, requested_by, reason] of each deleted job whose cancel request the finish overtook).

    Run once per fenced job, inside its transaction: prepared, and sent in one round trip
    with psycopg's BEGIN when the handler ran no statement before it (:mod:`vpay.pipelined`)."""
    params: dict[str, Any] = {
        "ttl": ttl_seconds,
        "job_ids": [f[0] for f in fences],
        "kinds": [f[1] for f in fences],
        "subjects": [f[2][:255] for f in fences],
        "ids": [lease[0] for lease in leases],
        "tokens": [lease[1] for lease in leases],
    }
    rows = execute_pipelined(_FENCE_AND_FINISH, params, in_transaction=True) if connection.in_atomic_block else None
    if rows is None:
        with connection.cursor() as cursor:
            cursor.execute(_FENCE_AND_FINISH, params)
            rows = cursor.fetchall()
    fenced, finished, overtaken = rows[0]
    return fenced, finished, json.loads(overtaken) if isinstance(overtaken, str) else overtaken


# A page of expired fence rows (index jobs_processed_expires_idx). Fences are never refreshed in place (ON CONFLICT DO
# NOTHING), but the age guard is repeated on the outer DELETE all the same: it is the
# only part a DELETE re-checks against a row version changed under it (as the idempotency
# sweep learned, api/idempotency.py).
_DELETE_EXPIRED_FENCES = """
DELETE FROM processed_jobs
 WHERE job_id IN (SELECT job_id FROM processed_jobs WHERE expires_at < now() LIMIT %s)
   AND expires_at < now()
"""


def delete_expired_fences(page: int = 1000) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_DELETE_EXPIRED_FENCES, [page])
        return cursor.rowcount
