"""An outage is not a crash: two real ``runworker`` processes at the default heartbeat and
lease (5 s, 12 s), each running a job that outlives a 15 s stop of the PostgreSQL the suite
owns. Before the rule that death is read from a worker's own beat, the first worker back
took the other's lapsed lease for a death and rescued its job: with one attempt, a
``crashed_worker`` dead letter for a job whose worker never died. Now every reaper waits a
lease after its own late beat, the live workers beat meanwhile, nothing is rescued, and each
job is handed back by its own worker (its connection died under it) and runs once more.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_for
from tests.outage_support import effect_labels, messages, query, scalar
from tests.owned_postgres import manage

pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(240)]

REAPED = "rescued the jobs of a dead worker"
OUTAGE_SECONDS = 15  # longer than the default lease (12 s)


def test_a_15s_outage_under_two_busy_workers_at_the_defaults_rescues_nothing(
    owned_postgres, owned_database, start_worker, tmp_path
):
    url = owned_database
    code = (
        "from jobs.adapters.postgres import JobRequest, enqueue_many\n"
        "enqueue_many(JobRequest(kind='task', max_attempts=1, payload={'task': 'tests.tasks.record_slowly_once',"
        f" 'args': [f'outage-{{i}}', 20.0, f'{tmp_path}/marker-{{i}}'], 'kwargs': {{}}}}) for i in range(2))\n"
    )
    manage(url, "shell", "-c", code)
    workers = [
        # runworker's defaults but the slots: a process per core (VPAY_WORKER_PROCESSES unset).
        start_worker(
            "--concurrency", "1", "--worker-id", f"live-{i}", env={"DATABASE_URL": url, "VPAY_WORKER_PROCESSES": ""}
        ).wait_started()
        for i in range(2)
    ]
    wait_for(
        lambda: (
            scalar(url, "SELECT count(DISTINCT locked_by) FROM jobs WHERE kind = 'task' AND locked_at IS NOT NULL") == 2
        ),
        timeout=30,
        message="each worker to hold one job",
    )

    owned_postgres.stop()

    time.sleep(OUTAGE_SECONDS)
    owned_postgres.start()

    wait_for(lambda: sum(effect_labels(url, "outage-").values()) == 2, timeout=90, message="both jobs to run again")
    # A lease and a reap period after the last effect, still nothing rescued.
    time.sleep(15)
    assert effect_labels(url, "outage-") == {"outage-0": 1, "outage-1": 1}
    assert query(url, "SELECT kind, cause, last_error FROM dead_letters WHERE kind = 'task'") == []
    for worker in workers:
        assert worker.proc.poll() is None, worker.output()[-3000:]
        assert REAPED not in messages(worker.log_path), worker.output()[-3000:]
