"""Death is read from a worker's own beat, on the database clock (jobs.maintenance.reaper, jobs.storage.leases):
a lapsed lease under a worker that still beats is not a death, a reaper just back from an
outage judges nobody for a lease, a stale row is judged again under its lock, and a beat
never waits on a row someone else holds. The real-process rehearsal of a database outage
under two workers at the default settings is in tests/test_outage_liveness.py."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance import liveness
from jobs.maintenance.thread import reap
from tests.conftest import database_url
from tests.queue_support import claim, execute, expire_lease, one, scalar, task_payload

LEASE = 12.0


def beat(worker: str, *, period: float = 5.0, lease: float = LEASE) -> int:
    return liveness.worker_heartbeat(liveness.WorkerIdentity(worker, "host", 1, 1, "default", period), lease)


def settle_in(worker: str, seconds_ago: float) -> None:
    """The worker has beaten on time since ``seconds_ago`` (its reaper may judge after a lease)."""
    execute("UPDATE workers SET alive_since = now() - make_interval(secs => %s) WHERE id = %s", [seconds_ago, worker])


def silence(worker: str, seconds: float) -> None:
    """The worker's last beat was ``seconds`` ago."""
    execute("UPDATE workers SET heartbeat_at = now() - make_interval(secs => %s) WHERE id = %s", [seconds, worker])


def held_by(job_id) -> str | None:
    return one("SELECT locked_by FROM jobs WHERE job_id = %s", [job_id])[0]


@pytest.fixture
def reaper():
    """A worker whose reaper has beaten on time for longer than a lease: it may judge."""
    beat("reaper")
    settle_in("reaper", LEASE + 1)
    return "reaper"


@pytest.mark.django_db
def test_a_lapsed_lease_under_a_worker_that_still_beats_is_not_a_death(reaper):
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    beat("worker-a")
    claim("worker-a", lease_seconds=30)
    expire_lease(job_id)  # the lease lapsed (a beat skipped its locked row, an outage) ...
    assert reap(reaper, beating=True) == (0, 0)  # ... but worker-a's own beat is fresh
    assert held_by(job_id) == "worker-a"


@pytest.mark.django_db
def test_a_worker_whose_beat_is_older_than_its_own_lease_is_dead_and_everything_it_held_is_rescued(reaper):
    ids = [queue.enqueue(JobKind.TASK, task_payload(), tenant=t) for t in "ab"]
    beat("worker-a", lease=20.0)
    claim("worker-a", lease_seconds=600, batch=2)  # leases far from lapsing: the row decides
    silence("worker-a", 15)  # older than the reaper's lease (12 s), not than its own (20 s)
    assert reap(reaper, beating=True) == (0, 0)
    silence("worker-a", 21)
    assert reap(reaper, beating=True) == (2, 0)
    assert [held_by(i) for i in ids] == [None, None]


@pytest.mark.django_db
def test_a_reaper_just_back_from_an_outage_judges_nobody_for_a_lease():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    beat("worker-a")
    claim("worker-a", lease_seconds=30)
    silence("worker-a", 15)  # as every live worker's beat looks when the database comes back
    beat("reaper")
    silence("reaper", 15)
    beat("reaper")  # the reaper's first beat after the outage: late, so it is just back
    assert scalar("SELECT alive_since > now() - interval '1 second' FROM workers WHERE id = 'reaper'")
    assert reap("reaper", beating=True) == (0, 0)
    assert held_by(job_id) == "worker-a"
    # A lease later, still silent, worker-a is dead.
    settle_in("reaper", LEASE + 1)
    assert reap("reaper", beating=True) == (1, 0)


@pytest.mark.django_db
def test_a_beat_on_time_keeps_alive_since_and_a_late_one_moves_it():
    beat("worker-a")
    settle_in("worker-a", 60)
    silence("worker-a", 6.5)  # within the 5 s period plus the 2 s margin
    beat("worker-a")
    assert scalar("SELECT alive_since < now() - interval '59 seconds' FROM workers WHERE id = 'worker-a'")
    silence("worker-a", 7.5)
    beat("worker-a")
    assert scalar("SELECT alive_since > now() - interval '1 second' FROM workers WHERE id = 'worker-a'")


@pytest.mark.django_db
def test_a_freshly_started_worker_judges_nobody_until_it_has_beaten_for_a_lease():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    claim("ghost", lease_seconds=30)
    expire_lease(job_id)  # no row, lease lapsed: dead by its lease
    assert reap("newcomer", beating=True) == (0, 0)  # no row yet: not ready
    beat("newcomer")
    assert reap("newcomer", beating=True) == (0, 0)  # just started
    settle_in("newcomer", LEASE + 1)
    assert reap("newcomer", beating=True) == (1, 0)


@pytest.mark.django_db
def test_workers_are_pruned_after_four_of_their_own_leases():
    beat("short", lease=5.0)
    beat("long", lease=60.0)
    silence("short", 21)
    silence("long", 21)
    assert liveness.prune_workers() == 1
    assert scalar("SELECT array_agg(id) FROM workers") == ["long"]


@pytest.mark.django_db(transaction=True)
def test_a_stale_row_whose_beat_is_in_flight_is_not_judged(reaper):
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    beat("worker-a")
    claim("worker-a", lease_seconds=30)
    silence("worker-a", 30)
    connection.close()
    with psycopg.connect(database_url()) as other:
        # worker-a's beat has taken its row and not committed yet: the reaper must not judge
        # the version it read before (a beat that committed would make the row fresh).
        other.execute("UPDATE workers SET heartbeat_at = now() WHERE id = 'worker-a'")
        assert reap(reaper, beating=True) == (0, 0)
        other.commit()
    assert reap(reaper, beating=True) == (0, 0)
    assert held_by(job_id) == "worker-a"


@pytest.mark.django_db(transaction=True)
def test_the_beat_never_waits_on_a_row_another_transaction_holds():
    ids = [queue.enqueue(JobKind.TASK, task_payload(), tenant=t) for t in "ab"]
    beat("worker-a")
    claim("worker-a", lease_seconds=30, batch=2)
    execute("UPDATE jobs SET lease_expires_at = now() WHERE locked_by = 'worker-a'")
    connection.close()
    done = threading.Event()
    with psycopg.connect(database_url()) as other:
        other.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [ids[0]])  # a settle in flight

        def beating():
            try:
                assert beat("worker-a") == 1  # the free one extended, the held one skipped
                done.set()
            finally:
                connection.close()

        thread = threading.Thread(target=beating)
        thread.start()
        thread.join(timeout=10)
        held_while_beating = done.is_set()
        other.rollback()
    thread.join(timeout=10)
    assert held_while_beating, "the beat waited for a row another transaction held"
    assert scalar("SELECT lease_expires_at > now() + interval '10 seconds' FROM jobs WHERE job_id = %s", [ids[1]])


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_inside_the_handlers_own_transaction_holds_no_lock_on_the_job_row():
    from django.db import transaction

    from tests.queue_support import claimed_context

    queue.enqueue(JobKind.TASK, task_payload())
    (job,) = claim("worker-a", lease_seconds=30).jobs
    ctx = claimed_context(job)
    ctx.loop_fenced = False  # a handler that owns its transactions
    with transaction.atomic():
        ctx.heartbeat()
        with psycopg.connect(database_url(), autocommit=True) as other:
            # An operator's cancel or the reaper takes the row at once, not after the commit.
            other.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE NOWAIT", [job.id])


@pytest.mark.django_db
def test_a_reap_that_reaches_a_returning_database_before_its_own_beat_judges_nobody(reaper):
    # The beat thread has not landed its first beat since the outage: alive_since has not
    # moved yet, but the reaper's own beat is as old as the outage. Nobody is judged, and
    # the reaper never judges itself.
    ids = [queue.enqueue(JobKind.TASK, task_payload(), tenant=t) for t in "ab"]
    beat("worker-a")
    claim("worker-a", lease_seconds=30)
    claim(reaper, lease_seconds=30)
    silence("worker-a", 15)
    silence(reaper, 15)
    assert reap(reaper, beating=True) == (0, 0)
    assert liveness.prune_workers(reaper, leases=1) == 0
    assert [held_by(i) for i in ids] == ["worker-a", reaper]
    beat(reaper)  # late: it is just back, and waits a lease
    assert reap(reaper, beating=True) == (0, 0)


@pytest.mark.django_db
def test_a_burst_worker_sees_work_held_by_a_worker_whose_beat_is_late():
    # What keeps a --burst worker from exiting while a reaper may yet rescue jobs for it.
    queue.enqueue(JobKind.TASK, task_payload())
    beat("holder")
    claim("holder", lease_seconds=30)
    assert not liveness.late_holders_waiting("burst")  # its holder beats on time
    silence("holder", 7.5)  # later than its 5 s period plus the 2 s margin
    assert liveness.late_holders_waiting("burst")
    assert not liveness.late_holders_waiting("holder")  # never its own


@pytest.mark.django_db
def test_a_supervisors_rescue_of_its_dead_child_judges_nobody_else():
    from jobs.runner import supervisor

    live, dead = (queue.enqueue(JobKind.TASK, task_payload(), tenant=t) for t in "ab")
    beat("live-worker")
    claim("live-worker", lease_seconds=600)
    silence("live-worker", 60)  # as every worker's beat looks just after an outage
    beat("sup.1")
    claim("sup.1", lease_seconds=600)
    assert supervisor.rescue("sup.1") == 1
    assert held_by(dead) is None  # the child it saw die: rescued at once, its lease unexpired
    assert held_by(live) == "live-worker"  # judged by nobody: the supervisor does not beat
    assert scalar("SELECT count(*) FROM workers WHERE id = 'sup.1'") == 0
