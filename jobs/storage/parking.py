"""Parked jobs: delayed work kept out of the claim's index until shortly before it is due.

The claim reads ``jobs_job_ready_idx`` (tenant, priority, run_at). A tenant's scan there
cannot stop at the first row not yet due (priority comes first), so every row of the tenant
waiting for a later run_at was stepped over on every claim that found fewer due rows than
free executors: a million jobs scheduled for tomorrow made each claim walk a million index
entries (``bench/SOAK.md``). As Oban stages ``scheduled`` jobs into ``available`` and Solid
Queue moves due scheduled executions into its ready table, a job due further out than
:data:`HORIZON_SECONDS` is *parked*:

* a ``BEFORE INSERT OR UPDATE OF run_at`` trigger (``jobs_job_park``, migration 0014) sets
  ``parked`` whenever ``run_at`` is written: every enqueue, retry, reschedule, hand-back and
  pull-forward, whatever wrote it (the ORM included);
* ``jobs_job_ready_idx`` holds only unparked rows, so the claim never sees a parked one;
* every worker unparks what is due within the horizon (:func:`unpark_due`) when it boots,
  before its first claim (a ``--burst`` worker started after none ran must not find nothing
  and exit), and its maintenance thread each :data:`STAGE_PERIOD` seconds after, so a job is
  back in the claim's index a horizon before its run_at, and runs on time as long as some
  worker's maintenance has run once in the last ``HORIZON_SECONDS - STAGE_PERIOD`` seconds.

``parked = false`` is always safe (the row is only slower to step over). A parked row past
its run_at means no worker ran: the oldest-claimable age (gauge and admin page; its SQL
ignores ``parked``) counts it as waiting, and the next worker to start runs it.
"""

from __future__ import annotations

from jobs.storage import sql
from jobs.storage.repository import NOTIFY_CHANNEL

# Must equal the interval in the trigger function jobs_job_park (jobs/migrations/0014):
# tests/test_parking.py checks the two agree on the database.
HORIZON_SECONDS = 15.0
STAGE_PERIOD = 1.0
PAGE = 5000
MAX_PAGES = 20  # per stage: up to 100,000 jobs a second come due without falling behind

# Unpark the parked jobs due within the horizon, oldest first, a page at a time (index
# jobs_job_parked_idx). SKIP LOCKED: another worker's stager, or an operator's write, has
# the row; the next stage takes it. Bookkeeping: a lost commit is redone by the next stage.
# NOTIFY for what is due already (a stager catching up after no worker ran), so idle
# workers claim it now rather than at their next poll.
_UNPARK = f"""
WITH due AS (
    SELECT id FROM jobs
     WHERE parked AND run_at <= now() + make_interval(secs => %(horizon)s)
     ORDER BY run_at
     LIMIT %(page)s
     FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE jobs j SET parked = false FROM due WHERE j.id = due.id
    RETURNING j.queue, j.run_at <= now() AS now_due
)
SELECT count(*), count(pg_notify('{NOTIFY_CHANNEL}', queue)) FILTER (WHERE now_due) FROM moved
"""


def unpark_due() -> int:
    """Unpark every job due within the horizon (up to ``PAGE * MAX_PAGES``); returns how many."""
    total = 0
    for _ in range(MAX_PAGES):
        rows = sql.bookkeeping_rows(_UNPARK, {"horizon": HORIZON_SECONDS, "page": PAGE})
        moved = rows[0][0] if rows else 0
        total += moved
        if moved < PAGE:
            break
    return total
