"""``runworker --processes N``: real supervisor and worker processes against the test database
(jobs.runner.supervisor). They drain one backlog together, each effect once; a child killed with
SIGKILL has its jobs rescued by the supervisor at once (not a lease later) and is replaced;
SIGTERM drains every child. The kill and the drain run at runworker's default process count
(a process per core), as a deployment does."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from jobs.adapters.postgres import enqueue_many
from jobs.primitives.ceilings import MACHINE_CORES
from tests.conftest import wait_for
from tests.test_worker_process import (
    dead_letters,
    duplicated_labels,
    effect_count,
    scalar,
    sql,
    task_request,
    task_rows,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("effects")]

# runworker's own default (the suite pins one process per runworker otherwise: tests/conftest.py).
DEFAULT_PROCESSES = {"VPAY_WORKER_PROCESSES": ""}
several_cores = pytest.mark.skipif(MACHINE_CORES < 2, reason="the default is one process on a one-core machine")


def records(worker) -> list[dict]:
    found = []
    for line in worker.output().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def started_ids(worker) -> list[str]:
    return [r["worker_id"] for r in records(worker) if r.get("message") == "worker started"]


def test_processes_drain_one_backlog_together_each_effect_once(start_worker):
    total = 300
    enqueue_many(task_request("record_pid_slowly", f"procs-{i:04d}", 0.01) for i in range(total))
    supervisor = start_worker("--processes", "2", "--concurrency", "2", "--burst", "--worker-id", "sup")
    assert supervisor.wait(timeout=120) == 0, supervisor.output()[-3000:]
    assert sorted(started_ids(supervisor)) == ["sup.1", "sup.2"]
    assert duplicated_labels("procs-") == []
    assert effect_count("procs-") == total
    assert task_rows() == 0 and dead_letters() == []


@several_cores
def test_a_killed_child_has_its_jobs_rescued_at_once_and_is_replaced(start_worker):
    total = 40
    # Slow enough that a child always holds jobs when it is killed; the default beat (5 s)
    # makes the lease 12 s: a rescue well inside that is the supervisor's, not a lease's.
    enqueue_many(task_request("record_pid_slowly", f"kill-{i:03d}", 0.5, max_attempts=5) for i in range(total))
    supervisor = start_worker("--concurrency", "2", "--worker-id", "sup", env=DEFAULT_PROCESSES)
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE locked_by = 'sup.1'") > 0, 60, 0.05, "sup.1 holding jobs")
    pids = {p.pid for p in psutil.Process(supervisor.proc.pid).children()}
    (victim_pid,) = sql("SELECT pid FROM workers WHERE id = 'sup.1'")[0]
    assert len(pids) == MACHINE_CORES and victim_pid in pids, (pids, victim_pid)
    victim = psutil.Process(victim_pid)
    victim.kill()

    def rescued_by_supervisor():
        lines = [r for r in records(supervisor) if r.get("message") == "rescued the jobs of a dead worker"]
        return next((r for r in lines if r.get("reaper") == "supervisor"), None)

    # The supervisor's own rescue (a sibling's reaper would log its own id as the reaper,
    # and only once the lease, 12 s here, had run out).
    line = wait_for(rescued_by_supervisor, 20, 0.05, "the supervisor's rescue")
    dead = line["dead_worker"]
    assert dead == "sup.1"
    assert scalar("SELECT count(*) FROM jobs WHERE locked_by = %s", [dead]) == 0
    assert scalar("SELECT count(*) FROM workers WHERE id = %s", [dead]) == 0
    died = [r for r in records(supervisor) if r.get("message", "").startswith("a worker process ended")]
    assert died and died[0]["how"] == "signal SIGKILL" and died[0]["worker_id"] == dead
    # A replacement takes its slot, after the restart pause.
    wait_for(lambda: f"{dead}r1" in started_ids(supervisor), 30, 0.05, "the replacement child")

    wait_for(lambda: effect_count("kill-") >= total, 120, 0.1, "the backlog to drain")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.output()[-3000:]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    # A job the kill cut short ran again (its effect is recorded at the end: once).
    assert duplicated_labels("kill-") == []
    assert task_rows() == 0 and dead_letters() == []


@several_cores
def test_sigterm_drains_every_child_and_exits_zero_even_when_the_whole_group_gets_it(start_worker):
    enqueue_many(task_request("record_pid_slowly", f"term-{i:02d}", 1.0) for i in range(4))
    supervisor = start_worker("--concurrency", "2", "--worker-id", "sup", env=DEFAULT_PROCESSES)
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE locked_at IS NOT NULL") == 4, 60, 0.05, "4 jobs running")
    children = psutil.Process(supervisor.proc.pid).children()
    assert len(children) == MACHINE_CORES
    supervisor.signal(signal.SIGTERM)
    # As a stop sent to the whole process group (systemd, kill -- -PGID) also reaches each
    # child: a second SIGTERM is still "drain", never "exit now". (A moment apart: two
    # pending SIGTERMs would merge into one.)
    time.sleep(0.3)
    for child in children:
        child.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.output()[-3000:]
    assert effect_count("term-") == 4  # each running job finished inside the grace
    assert task_rows() == 0
    assert scalar("SELECT count(*) FROM workers WHERE id LIKE 'sup.%'") == 0  # clean exits deregister
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


@several_cores
@pytest.mark.slow
def test_a_backlog_survives_repeated_sigkills_of_children_at_the_defaults_each_effect_once(start_worker):
    """The SIGKILL rehearsal at runworker's defaults (a process per core, 4 slots each, the
    5 s beat): three children killed mid-backlog, one after another; the supervisor rescues
    each one's jobs and replaces it, and every effect lands exactly once."""
    total = 400
    enqueue_many(task_request("record_pid_slowly", f"kills-{i:04d}", 0.05) for i in range(total))
    supervisor = start_worker("--worker-id", "sup", env=DEFAULT_PROCESSES)
    killed = []
    for round_ in range(3):
        before = effect_count("kills-")
        wait_for(lambda before=before: effect_count("kills-") >= before + 40, 60, 0.05, f"40 more effects ({round_})")
        holders = sql("SELECT w.id, w.pid FROM workers w JOIN jobs j ON j.locked_by = w.id GROUP BY w.id, w.pid")
        assert holders, "no child holds a job"
        victim_id, victim_pid = holders[0]
        psutil.Process(victim_pid).kill()
        killed.append(victim_id)
        wait_for(
            lambda victim_id=victim_id: scalar("SELECT count(*) FROM jobs WHERE locked_by = %s", [victim_id]) == 0,
            20,
            0.05,
            f"{victim_id}'s jobs rescued",
        )
    assert effect_count("kills-") < total, "the backlog ran out before the last kill; the rehearsal proves nothing"
    wait_for(lambda: effect_count("kills-") >= total and task_rows() == 0, 180, 0.1, "the backlog to drain")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 0, supervisor.output()[-3000:]
    ended = [r["worker_id"] for r in records(supervisor) if r.get("message", "").startswith("a worker process ended")]
    assert sorted(ended) == sorted(killed)
    assert duplicated_labels("kills-") == []
    assert effect_count("kills-") == total
    assert dead_letters() == []
    assert scalar("SELECT count(*) FROM processed_jobs WHERE kind = 'task'") == total
