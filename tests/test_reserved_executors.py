"""Executors webhooks may never hold (one merchant's slow endpoints could hold every
executor, and every merchant's settlements waited): the merchant-paced kinds fill at most
``concurrency - reserved`` executors of a worker; every other kind may use them all."""

from __future__ import annotations

import threading
import time

import pytest

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.primitives import ceilings
from jobs.runner.worker import Worker
from tests.queue_support import task_payload


@pytest.mark.parametrize(
    ("configured", "concurrency", "kept"),
    [(-1, 1, 0), (-1, 2, 1), (-1, 4, 1), (-1, 8, 2), (-1, 16, 4), (0, 4, 0), (3, 4, 3), (9, 4, 3)],
)
def test_the_reserved_share_is_a_quarter_at_least_one_never_all(settings, configured, concurrency, kept):
    settings.VPAY_WORKER_RESERVED_EXECUTORS = configured
    assert ceilings.reserved_executors(concurrency) == kept


@pytest.mark.django_db
def test_webhooks_fill_all_but_the_reserved_executor_which_takes_other_kinds_only():
    for i in range(6):
        queue.enqueue(JobKind.WEBHOOK_DELIVER, {"delivery_id": i}, tenant=f"merchant-{i}")
    worker = Worker(concurrency=4)  # one executor webhooks may never hold
    first = worker.dispatcher.next_job()
    assert first.kind == "webhook_deliver"
    assert worker.running_count() == 3  # the fourth executor is kept, though deliveries wait
    assert [worker.dispatcher.next_job().kind for _ in range(2)] == ["webhook_deliver"] * 2  # handed over
    queue.enqueue(JobKind.POLL_CHARGE, {"charge_id": "ch_reserved"}, tenant="payer")
    # The kept executor claims the charge's poll, never one of the three deliveries still due.
    assert worker.dispatcher.next_job().kind == "poll_charge"
    assert worker.running_count() == 4


@pytest.mark.django_db
def test_other_kinds_may_use_every_executor():
    for i in range(6):
        queue.enqueue(JobKind.TASK, task_payload(), tenant=f"busy-{i}")
    worker = Worker(concurrency=4)
    # A claim asks for at most the paced room (it cannot tell what it will get), then the
    # next idle executor claims the rest: tasks are not paced by merchants, none idles.
    assert [worker.dispatcher.next_job().kind for _ in range(4)] == ["task"] * 4
    assert worker.running_count() == 4


@pytest.mark.django_db
def test_an_executor_that_found_a_claim_running_is_woken_when_it_ends_even_empty():
    """The reserved executor's claim for the unpaced kinds can be futile and long (it steps
    over a tenant's backlog of deliveries); an executor that finished meanwhile found the
    claim lock taken. It must claim as soon as that claim ends, not at the idle poll."""
    worker = Worker(concurrency=4, idle_sleep=5.0)
    dispatcher = worker.dispatcher
    first_running, got = threading.Event(), []

    def claim(asked, alone, kinds=None):
        if not first_running.is_set():
            first_running.set()
            time.sleep(0.3)
            return []  # futile: found nothing
        return ["a job"]

    dispatcher.claim = claim
    futile = threading.Thread(target=dispatcher.next_job, daemon=True)
    futile.start()
    first_running.wait(5)
    began = time.monotonic()
    waiting = threading.Thread(target=lambda: got.append((dispatcher.next_job(), time.monotonic() - began)))
    waiting.start()
    waiting.join(3)
    worker._stopping.set()
    dispatcher.wake()
    futile.join(5)
    assert got and got[0][0] == "a job", "the executor slept through the end of the claim it waited for"
    assert got[0][1] < 1.5


@pytest.mark.django_db
def test_idle_executors_whose_claims_come_up_empty_do_not_wake_each_other_in_turn():
    """Each empty claim wakes the executors that waited for it, and each of those claims once;
    the one that woke them must not take that wake as work of its own, or two idle executors
    wake each other without end."""
    worker = Worker(concurrency=4, idle_sleep=5.0)
    dispatcher = worker.dispatcher
    claims: list[float] = []

    def claim(asked, alone, kinds=None):
        claims.append(time.monotonic())
        time.sleep(0.002)
        return []

    dispatcher.claim = claim
    executors = [threading.Thread(target=dispatcher.next_job, daemon=True) for _ in range(4)]
    for executor in executors:
        executor.start()
    time.sleep(0.5)
    worker._stopping.set()
    dispatcher.wake()
    for executor in executors:
        executor.join(5)
    assert len(claims) <= 8, f"{len(claims)} empty claims in half a second of an idle worker"


@pytest.mark.django_db
def test_a_hand_over_by_the_claim_an_empty_claim_woke_is_not_lost_to_that_executor():
    """E's claim comes up empty and wakes W and Y, which waited for it; W's claim takes three
    jobs and hands two over. E, slowed between its wake and its wait (a GIL switch), must still
    take the third at once, not at its idle poll."""
    from types import SimpleNamespace

    worker = Worker(concurrency=3, idle_sleep=3.0)
    dispatcher = worker.dispatcher
    claims: list[str] = []
    guard = threading.Lock()

    def claim(asked, alone, kinds=None):
        with guard:
            claims.append(threading.current_thread().name)
            n = len(claims)
        if n == 1:  # E's: empty, and slow enough that W and Y find the lock taken
            deadline = time.monotonic() + 2
            while dispatcher._lock_waiters < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            return []
        if n == 2:  # the woken waiter's: three jobs (a NOTIFY's)
            jobs = [SimpleNamespace(id=i, suspect=False, kind="task") for i in (1, 2, 3)]
            worker.register(jobs)
            return jobs
        return []

    wake = dispatcher.wake

    def slow_after_es_wake(executors=None):
        generation = wake(executors)
        if threading.current_thread().name == "E" and claims == ["E"]:
            time.sleep(0.2)
        return generation

    dispatcher.claim, dispatcher.wake = claim, slow_after_es_wake
    got: dict[str, tuple] = {}

    def run(name):
        began = time.monotonic()
        job = dispatcher.next_job()
        got[name] = (getattr(job, "id", None), time.monotonic() - began)

    e = threading.Thread(target=run, args=("E",), name="E", daemon=True)
    e.start()
    while not claims:
        time.sleep(0.001)
    others = [threading.Thread(target=run, args=(n,), name=n, daemon=True) for n in ("W", "Y")]
    for thread in others:
        thread.start()
    for thread in (e, *others):
        thread.join(5)
    worker._stopping.set()
    wake()
    assert got["E"][0] is not None and got["E"][1] < 1.0, got


@pytest.mark.django_db
def test_an_empty_claim_for_the_unpaced_kinds_is_not_repeated_at_every_wake_only_after_a_pause_or_a_notify():
    """With deliveries in every executor they may hold, the kept executor's claim for the
    other kinds steps over the deliveries' backlog; empty, it waits UNPACED_RECHECK_SECONDS
    (or a NOTIFY) before the next, however often it is woken meanwhile."""
    from jobs.runner import dispatch

    for i in range(6):
        queue.enqueue(JobKind.WEBHOOK_DELIVER, {"delivery_id": i}, tenant=f"merchant-{i}")
    worker = Worker(concurrency=4, idle_sleep=5.0)
    dispatcher = worker.dispatcher
    for _ in range(3):
        assert dispatcher.next_job().kind == "webhook_deliver"
    claims: list[float] = []

    def claim(asked, alone, kinds=None):
        assert kinds is not None  # the paced executors are full: the unpaced kinds alone
        claims.append(time.monotonic())
        return ["a poll"] if len(claims) > 100 else []

    dispatcher.claim = claim
    kept = threading.Thread(target=dispatcher.next_job, daemon=True)
    kept.start()
    began = time.monotonic()
    while time.monotonic() - began < 1.0:  # other executors' claims wake it, a hundred times a second
        dispatcher.wake()
        time.sleep(0.01)
    in_a_second = len(claims)
    assert 2 <= in_a_second <= 1.0 / dispatch.UNPACED_RECHECK_SECONDS + 2, in_a_second
    # A NOTIFY (new work) lifts the pause at once.
    noticed = time.monotonic()
    time.sleep(0.02)
    before = len(claims)
    dispatcher.notified()
    wait_until = time.monotonic() + 0.1
    while len(claims) == before and time.monotonic() < wait_until:
        time.sleep(0.005)
    assert len(claims) > before and claims[before] - noticed < 0.1
    worker._stopping.set()
    dispatcher.wake()
    kept.join(5)
