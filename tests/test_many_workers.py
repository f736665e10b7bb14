"""Four ``runworker`` processes on one database and one shared backlog: every job runs
exactly once, and the work is spread across all four (docs/deploy.md, "Many workers").

The fast version runs in the normal suite; the long one (a bigger backlog, more executors,
one worker SIGKILLed halfway and replaced) is marked ``slow``.
"""

from __future__ import annotations

import collections

import pytest

from jobs.adapters.postgres import JobRequest, enqueue_many
from tests.conftest import wait_for
from tests.test_worker_process import dead_letters, duplicated_labels, effect_count, scalar, wait_started

pytestmark = pytest.mark.django_db(transaction=True)


def backlog(prefix: str, total: int, seconds: float) -> None:
    enqueue_many(
        JobRequest(
            kind="task",
            payload={"task": "tests.tasks.record_pid_slowly", "args": [f"{prefix}{i:05d}", seconds], "kwargs": {}},
            max_attempts=20,
        )
        for i in range(total)
    )


def runs_by_pid(prefix: str) -> collections.Counter:
    rows = scalar("SELECT json_agg(value) FROM test_effects WHERE label LIKE %s", [prefix + "%"]) or []
    return collections.Counter(int(pid) for pid in rows)


def assert_each_job_ran_once(prefix: str, total: int) -> None:
    assert duplicated_labels(prefix) == []
    assert effect_count(prefix) == total
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'task'") == 0
    assert scalar("SELECT count(*) FROM processed_jobs WHERE kind = 'task'") == total
    assert dead_letters() == []


def test_four_workers_share_one_backlog_each_job_once(effects, start_worker):
    total = 240
    workers = [start_worker("--concurrency", "2", "--worker-id", f"many-{i}") for i in range(4)]
    for worker in workers:
        wait_started(worker)
    # Enqueued once all four listen: the NOTIFY wakes every one of them.
    backlog("many-", total, 0.02)
    wait_for(lambda: effect_count("many-") >= total, timeout=60, message="the backlog to drain")
    assert_each_job_ran_once("many-", total)
    by_pid = runs_by_pid("many-")
    assert set(by_pid) == {w.proc.pid for w in workers}, by_pid
    # Spread, not merely touched: each did a fair part (an even share is 60).
    assert min(by_pid.values()) >= total // 16, by_pid


@pytest.mark.slow
def test_four_workers_drain_a_large_backlog_through_a_sigkill_each_job_once(effects, start_worker):
    total = 3000
    backlog("large-", total, 0.005)
    workers = [start_worker("--concurrency", "4", "--heartbeat", "0.5") for _ in range(4)]
    # The kill waits for each worker's first job too: under a loaded run one worker can boot
    # after the others have done a third, and the one killed must have shown it took part.
    wait_for(
        lambda: effect_count("large-") >= total // 3 and len(runs_by_pid("large-")) == len(workers),
        timeout=120,
        message="a third of the backlog, with a job run by each worker",
    )
    workers[0].kill()  # its leases are rescued by the others' reapers, about two beats later
    replacement = start_worker("--concurrency", "4", "--heartbeat", "0.5")
    wait_for(lambda: effect_count("large-") >= total, timeout=180, message="the backlog to drain")
    assert_each_job_ran_once("large-", total)
    by_pid = runs_by_pid("large-")
    assert {w.proc.pid for w in workers} <= set(by_pid) <= {w.proc.pid for w in [*workers, replacement]}, by_pid
