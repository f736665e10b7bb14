"""The SQL of a carried batch of polls (``charges.services.poll_batch``): which of a
merchant's due polls a running poll can carry."""

from __future__ import annotations

from charges.repository import POLL_DEDUPE_PREFIX
from charges.states import ChargeStatus
from vpay.pipelined import fetch_prepared

# A merchant's due poll jobs beside the carrier's whose charges are submitted on the same
# rail, oldest first: a bounded walk of the merchant's first {walk} ready jobs in
# jobs_job_ready_idx (tenant, priority, run_at; the claim's own order; its predicate spelled
# here, so the generic plan uses it), so a merchant whose backlog is mostly other kinds costs
# this a bounded scan and maybe no batch, then each charge by primary key. Read without
# locks: the hold (jobs.port.hold_waiting) is what takes a job, and the poll's own read after
# it is what decides. Prepared and planned generic (vpay.pipelined.fetch_prepared): planned
# for its parameters it was planned again at every batch. The two LIMITs are written into the
# statement (a process's constants: the walk and the batch setting), so the generic plan is
# priced for them, not for a tenth of the tenant's ready jobs.
_DUE_BESIDE = f"""
SELECT c.id FROM (
    SELECT j.dedupe_key, j.priority, j.run_at FROM jobs j
     WHERE j.tenant = %(merchant)s::text AND j.locked_at IS NULL AND NOT j.parked AND j.run_at <= now()
     ORDER BY j.priority, j.run_at
     LIMIT {{walk}}
) j
JOIN charges c ON c.id = substr(j.dedupe_key, {len(POLL_DEDUPE_PREFIX) + 1})
 WHERE starts_with(j.dedupe_key, '{POLL_DEDUPE_PREFIX}') AND c.rail = %(rail)s::text
   AND c.status = '{ChargeStatus.SUBMITTED}' AND c.id <> %(charge)s::text
 ORDER BY j.priority, j.run_at
 LIMIT {{limit}}
"""
_BY_LIMITS: dict[tuple[int, int], str] = {}


def due_polls_beside(merchant_id: str, rail: str, charge_id: str, limit: int, walk: int) -> list[str]:
    """Up to ``limit`` charge ids (see :data:`_DUE_BESIDE`)."""
    key = (int(walk), int(limit))  # integers only into the text
    sql = _BY_LIMITS.get(key)
    if sql is None:
        sql = _BY_LIMITS[key] = _DUE_BESIDE.format(walk=key[0], limit=key[1])
    return [
        r[0] for r in fetch_prepared(sql, {"merchant": merchant_id, "rail": rail, "charge": charge_id}, generic=True)
    ]
