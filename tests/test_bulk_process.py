"""Bulk replay against real ``runworker`` processes: a worker SIGKILLed in the middle of a
large expansion leaves an ``expanding`` operation that another worker finishes, with every
unit created once and every letter's effect once; the shell follows it to the end."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from jobs.bulk_models import BulkOperation, BulkOperationKind
from jobs.services import bulk
from tests.conftest import wait_for
from tests.queue_support import count, scalar
from tests.test_bulk_replay import letters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SMALL_PAGES = {"VPAY_BULK_PAGE_SIZE": "5"}


def test_a_worker_killed_mid_expansion_leaves_it_expanding_and_the_next_worker_creates_each_unit_once(
    effects, start_worker
):
    n = 1500
    ids = letters(n)
    op_id = bulk.bulk_operation_submit(
        operation=BulkOperationKind.REPLAY_DEAD_LETTERS, filter={"kinds": ["task"]}, actor="ops-olga"
    )
    first = start_worker("--concurrency", "2", "--heartbeat", "0.5", env=SMALL_PAGES)
    wait_for(
        lambda: scalar("SELECT matched FROM bulk_operations WHERE id = %s", [op_id]) >= 50, timeout=60, interval=0.01
    )
    first.kill()
    killed = BulkOperation.objects.get(pk=op_id)
    assert killed.state == "expanding" and 50 <= killed.matched < n  # the kill really was mid-way

    start_worker("--concurrency", "4", "--heartbeat", "0.5", env=SMALL_PAGES)
    wait_for(lambda: BulkOperation.objects.get(pk=op_id).state == "done", timeout=240, message="the operation done")
    final = BulkOperation.objects.get(pk=op_id)
    assert (final.matched, final.created, final.done, final.refused) == (n, n, n, 0)
    assert count("bulk_items", "operation_id = %s", [op_id]) == n
    # Done means every letter was replayed (re-enqueued); the replayed jobs run after.
    wait_for(
        lambda: count("jobs", "kind IN ('task', 'bulk_item')") == 0, timeout=120, message="the replayed jobs to run"
    )
    labels = [label for label, _ in effects("bulk-")]
    assert len(labels) == n and set(labels) == {f"bulk-{i}" for i in range(1, n + 1)}
    assert count("dead_letters", "id = ANY(%s) AND state = 'replayed'", [ids]) == n


def test_replay_bulk_wait_prints_the_progress_until_the_operation_is_done(effects, start_worker):
    letters(200)
    start_worker("--concurrency", "2", "--heartbeat", "0.5", env={"VPAY_BULK_PAGE_SIZE": "10"})
    out = io.StringIO()
    call_command("deadletters", "replay", "--bulk", "--kind", "task", "--wait", "--timeout", "120", stdout=out)
    lines = out.getvalue().splitlines()
    op_id = scalar("SELECT max(id) FROM bulk_operations")
    assert lines[0] == f"submitted bulk operation #{op_id} (replay_dead_letters)"
    assert len(lines) >= 3  # submitted, then at least one line on the way and the last
    assert lines[-1] == (
        f"bulk operation #{op_id} replay_dead_letters: done; matched 200, created 200, done 200, refused 0"
    )
    assert all(line.startswith(f"bulk operation #{op_id} replay_dead_letters: ") for line in lines[1:])
    wait_for(lambda: len(effects("bulk-")) == 200, timeout=120, message="the replayed jobs to run")
