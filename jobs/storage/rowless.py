"""A claimed job that has no row in ``jobs``: the in-process adapter's (``jobs.adapters.inprocess``).

It runs through the same code path as a claimed row (``jobs.runner.invoke.run_job``), but nobody
holds a lease on it: there is no row to heartbeat or to delete. The two places that touch
the job's row ask :func:`rowless` first. Row ids start at 1, so 0 names no row.
"""

from __future__ import annotations

ROWLESS_ID = 0


def rowless(job) -> bool:
    return job.id == ROWLESS_ID
