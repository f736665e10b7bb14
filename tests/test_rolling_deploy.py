"""A rolling deploy with real processes: an older release's worker meets a newer release's
work, and leaves it, with no attempt spent, for a newer release's worker.

The newer release is played for real: a module that exists only on the newer worker's
``PYTHONPATH`` (a task path the older release does not have), and, for a kind the older
release lacks, a worker whose registry has one kind fewer is not needed: the claim's kind
filter is shown at the statement (tests/test_worker_loop.py). The unclaimed-kind alert is
shown against the real database here too.
"""

from __future__ import annotations

import logging
import textwrap

import pytest

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance.unclaimable import UnclaimableWatch
from tests.conftest import wait_for
from tests.queue_support import count, execute, one, task_payload

pytestmark = pytest.mark.timeout(180)


def job_state(job_id) -> tuple:
    return one("SELECT attempts, locked_by, last_error FROM jobs WHERE job_id = %s", [str(job_id)]) or ()


@pytest.mark.django_db(transaction=True)
def test_an_older_worker_leaves_a_newer_releases_task_to_a_newer_worker_with_no_attempt_spent(
    effects, start_worker, tmp_path
):
    newer = tmp_path / "newer_release"
    newer.mkdir()
    (newer / "newer_tasks.py").write_text(
        textwrap.dedent(
            """
            from jobs.tasks_api import task

            from tests.tasks import _record


            @task
            def record_new(label: str) -> None:
                _record(label)
            """
        )
    )
    job_id = queue.enqueue(JobKind.TASK, task_payload("newer_tasks.record_new", "rolled"), max_attempts=1)

    older = start_worker("--worker-id", "older").wait_started()
    wait_for(
        lambda: "this worker cannot run it" in (job_state(job_id) or ("", "", ""))[2],
        timeout=30,
        message="the older worker to hand the newer task back",
    )
    attempts, locked_by, _ = job_state(job_id)
    assert (attempts, locked_by) == (0, None)  # one attempt only, and none spent
    assert count("dead_letters") == 0

    newest = start_worker("--worker-id", "newer", env={"PYTHONPATH": str(newer)}).wait_started()
    # Offered again 10 s after each hand-back; whichever worker claims it next, the newer
    # one runs it (the older hands it back again, still at no cost).
    wait_for(
        lambda: count("jobs", "job_id = %s", [str(job_id)]) == 0,
        timeout=60,
        message="the newer worker to run it: " + newest.output()[-2000:],
    )
    assert count("test_effects", "label = 'rolled'") == 1
    assert count("dead_letters") == 0
    assert older.proc.poll() is None


@pytest.mark.django_db
def test_a_kind_no_worker_here_can_claim_alerts_once_it_has_waited_past_the_window(settings, caplog):
    settings.VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS = 60
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    older_kinds = [k.value for k in JobKind if k is not JobKind.TASK]
    watch = UnclaimableWatch(["default"], older_kinds)
    assert watch.check() == []  # due, but not yet past the window
    execute("UPDATE jobs SET run_at = now() - interval '5 minutes' WHERE job_id = %s", [str(job_id)])
    with caplog.at_level(logging.ERROR, logger="jobs.runner.worker"):
        found = watch.check()
        assert watch.check() == found  # found again, but alerted once per window
    assert [(kind, n) for kind, n, _ in found] == [("task", 1)]
    alerts = [r for r in caplog.records if getattr(r, "alert", False)]
    assert len(alerts) == 1 and alerts[0].kind == "task" and alerts[0].waiting == 1
    # A worker that has the kind sees nothing to report.
    assert UnclaimableWatch(["default"], [k.value for k in JobKind]).check() == []
