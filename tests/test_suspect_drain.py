"""After a crash that held several jobs, suspects wait to run alone: one worker at a time stops
claiming for them, not every worker; the flag follows the truth at every check; and a worker
with a handler that does not finish gives the role up instead of never claiming again."""

from __future__ import annotations

import pytest

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.runner import dispatch
from jobs.runner.worker import Worker
from tests.queue_support import claim, execute, task_payload


def beating_worker(name: str) -> Worker:
    """A worker as runworker runs it (a workers row, heartbeating), driven by its steps."""
    worker = Worker(worker_id=name, concurrency=2)
    worker._heartbeating = True
    worker.heartbeat()
    return worker


def a_suspect_waits() -> None:
    job_id = queue.enqueue(JobKind.TASK, task_payload(), tenant="s")
    execute("UPDATE jobs SET crashes = 1 WHERE job_id = %s", [job_id])


@pytest.mark.django_db
def test_only_one_worker_stops_claiming_for_a_suspect():
    a_suspect_waits()
    workers = [beating_worker(f"w-{i}") for i in range(3)]
    for worker in workers:
        worker.check_suspects()
    assert [w.dispatcher.suspect_waiting for w in workers] == [True, False, False]
    # The others keep claiming ordinary work meanwhile.
    queue.enqueue(JobKind.TASK, task_payload(), tenant="t")
    workers[1].register([claim("w-1").jobs[0]])  # something runs on w-1
    assert workers[1].dispatcher._may_claim()


@pytest.mark.django_db
def test_the_flag_follows_the_truth_when_another_worker_took_the_suspect():
    a_suspect_waits()
    worker = beating_worker("w-0")
    worker.check_suspects()
    assert worker.dispatcher.suspect_waiting
    execute("UPDATE jobs SET crashes = 0")  # settled elsewhere (or by an operator)
    worker.check_suspects()
    assert not worker.dispatcher.suspect_waiting
    other = beating_worker("w-1")  # and the role is free for the next suspect
    a_suspect_waits()
    other.check_suspects()
    assert other.dispatcher.suspect_waiting


@pytest.mark.django_db
def test_a_worker_that_is_not_idle_in_time_gives_the_role_up_and_claims_again():
    a_suspect_waits()
    queue.enqueue(JobKind.TASK, task_payload(), tenant="t")
    hung = beating_worker("hung")
    hung.register([claim("hung").jobs[0]])  # a handler that never returns
    hung.check_suspects()
    assert hung.dispatcher.suspect_waiting
    hung.dispatcher._draining_since -= dispatch.SUSPECT_DRAIN_SECONDS - 1
    hung.check_suspects()
    assert hung.dispatcher.suspect_waiting  # not yet: it may still finish in time
    hung.dispatcher._draining_since -= 2
    hung.check_suspects()
    assert not hung.dispatcher.suspect_waiting  # claims again
    hung.check_suspects()
    assert not hung.dispatcher.suspect_waiting  # and leaves the role to others for a while
    other = beating_worker("other")
    other.check_suspects()
    assert other.dispatcher.suspect_waiting


@pytest.mark.django_db
def test_running_suspects_alone_is_the_drain_working_not_a_worker_that_is_not_idle():
    a_suspect_waits()
    a_suspect_waits()  # a crash that held several: they run one after another
    worker = beating_worker("drainer")
    worker.check_suspects()
    (suspect,) = worker._claim(2, alone=True)
    assert suspect.suspect and worker._solo
    worker.dispatcher._draining_since -= dispatch.SUSPECT_DRAIN_SECONDS + 1  # a long suspect
    worker.check_suspects()
    assert worker.dispatcher.suspect_waiting  # keeps the role while its suspect runs alone


@pytest.mark.django_db
def test_a_burst_worker_runs_a_waiting_suspect_before_it_exits():
    # Its maintenance thread has not flagged the suspect yet (it does so once a beat): the
    # burst finds nothing ordinary to claim, runs nothing, and would exit leaving it behind.
    a_suspect_waits()
    worker = Worker(worker_id="burst", concurrency=2, burst=True)
    worker._heartbeating = True
    worker.heartbeat()
    job = worker.dispatcher.next_job()
    assert job is not None and job.suspect and worker._solo


@pytest.mark.django_db
def test_a_burst_worker_runs_the_suspects_a_rescue_made_between_its_two_looks():
    """Its first look finds no suspect (the dead worker still holds the job); the rescue commits
    (the job free, a suspect, its holder gone); then its look for late holders finds none. It
    must look for suspects again before it exits, or it leaves the rescued job behind (the
    repeated SIGKILL rehearsal, tests/test_worker_process.py, did once)."""
    job_id = queue.enqueue(JobKind.TASK, task_payload(), tenant="s")
    worker = Worker(worker_id="burst", concurrency=2, burst=True)
    worker._heartbeating = True
    worker.heartbeat()

    def the_rescue_lands_now():
        execute("UPDATE jobs SET crashes = 1 WHERE job_id = %s", [job_id])  # as the reaper frees it
        return False  # and so no holder is late any more

    claims = worker.dispatcher.claim

    def the_job_held_by_a_dead_worker_at_first(asked, alone, kinds=None):
        if not the_job_held_by_a_dead_worker_at_first.seen:
            the_job_held_by_a_dead_worker_at_first.seen = True
            return []
        return claims(asked, alone, kinds)

    the_job_held_by_a_dead_worker_at_first.seen = False
    worker.dispatcher.claim = the_job_held_by_a_dead_worker_at_first
    worker.dispatcher._late_holders_waiting = the_rescue_lands_now
    job = worker.dispatcher.next_job()
    assert job is not None and job.suspect, "the burst exited with a rescued suspect waiting"
