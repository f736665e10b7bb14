"""Executors kept for the kinds that move money (issue: one merchant's slow webhooks could
hold every executor, and every merchant's settlements waited): the unreserved kinds fill at
most ``concurrency - reserved`` executors of a worker; the rest claim only reserved kinds."""

from __future__ import annotations

import pytest

from jobs import ceilings, queue
from jobs.kinds import JobKind
from jobs.worker import Worker
from tests.queue_support import task_payload


@pytest.mark.parametrize(
    ("configured", "concurrency", "kept"),
    [(-1, 1, 0), (-1, 2, 1), (-1, 4, 1), (-1, 8, 2), (-1, 16, 4), (0, 4, 0), (3, 4, 3), (9, 4, 3)],
)
def test_the_reserved_share_is_a_quarter_at_least_one_never_all(settings, configured, concurrency, kept):
    settings.VPAY_WORKER_RESERVED_EXECUTORS = configured
    assert ceilings.reserved_executors(concurrency) == kept


@pytest.mark.django_db
def test_other_work_fills_all_but_the_reserved_executor_which_takes_only_money_kinds():
    for i in range(6):
        queue.enqueue(JobKind.TASK, task_payload(), tenant=f"busy-{i}")
    worker = Worker(concurrency=4)  # one executor kept for the money kinds
    first = worker.dispatcher.next_job()
    assert first.kind == "task"
    assert worker.running_count() == 3  # the fourth executor is kept, though tasks wait
    assert [worker.dispatcher.next_job().kind for _ in range(2)] == ["task", "task"]  # handed over
    queue.enqueue(JobKind.POLL_CHARGE, {"charge_id": "ch_reserved"}, tenant="payer")
    # The kept executor claims the charge's poll, never one of the three tasks still due.
    assert worker.dispatcher.next_job().kind == "poll_charge"
    assert worker.running_count() == 4
