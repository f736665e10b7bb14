"""A bulk operation ends in a state that says what happened when its jobs end without
their handler's answer: an operator's cancel (or discard) of its expansion, and a unit
dead-lettered (here by the reaper: its worker died on its last attempt). Real PostgreSQL,
the real cancel service, reaper and replay."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import CommandError
from django.db import connection

from jobs.bulk_models import BulkItem, BulkItemState, BulkOperation, BulkOperationState
from jobs.maintenance.thread import reap
from jobs.models import DeadLetter
from jobs.operator import bulk_watch
from jobs.runner.worker import Worker
from jobs.services import cancels, dead_letters
from tests.queue_support import claim, execute, rows, scalar
from tests.test_bulk_replay import expand_once, letters, run_all, submit

pytestmark = pytest.mark.django_db


def envelope(op_id: int) -> BulkOperation:
    return BulkOperation.objects.get(pk=op_id)


def cancel_expansion(op_id: int) -> int:
    """An operator cancels the operation's waiting expansion job; the dead letter's id."""
    job_id = scalar("SELECT job_id FROM jobs WHERE dedupe_key = %s", [f"bulk:{op_id}:expand"])
    return cancels.job_cancel(job_id=job_id, actor="olga", reason="wrong filter").dead_letter_id


def test_cancelling_an_expansion_before_it_ran_cancels_the_operation(effects):
    letters(5)
    op_id = submit()
    cancel_expansion(op_id)
    op = envelope(op_id)
    assert (op.state, op.created) == (BulkOperationState.CANCELLED, 0)
    assert op.finished_at is not None
    assert op.error == "expansion cancelled by olga: wrong filter"
    run_all()
    assert effects("bulk-") == []
    # The shell's --wait stops there and says so, with a non-zero exit.
    out = io.StringIO()
    progress = bulk_watch.watch(op_id, out, timeout=5)
    with pytest.raises(CommandError, match=f"bulk operation #{op_id} was cancelled .0 skipped.: expansion cancelled"):
        bulk_watch.report(progress, io.StringIO(), "replay")
    assert "cancelled; matched 0, created 0" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_running_expansion_stops_it_at_its_next_page_and_cancels_the_operation(effects, settings):
    settings.VPAY_BULK_PAGE_SIZE = 5
    letters(12)
    op_id = submit()
    worker = Worker(worker_id="w-bulk", concurrency=1)
    worker.heartbeat()  # a live worker: the cancel is a request its heartbeat reads
    pages = iter(range(10))

    def cancel_after_the_first_page(job, sql):
        if next(pages) == 1:  # the operator, on their own connection, while the 2nd page is written
            operator = threading.Thread(target=cancel_on_own_connection, args=(job,))
            operator.start()
            operator.join()

    expand_job = scalar("SELECT job_id FROM jobs WHERE kind = 'bulk_expand'")
    with connection.execute_wrapper(
        lambda execute, sql, params, many, context: (
            cancel_after_the_first_page(expand_job, sql) if "INSERT INTO bulk_items" in sql else None,
            execute(sql, params, many, context),
        )[1]
    ):
        assert worker.run_once() == 1
    op = envelope(op_id)
    assert op.state in (BulkOperationState.CANCELLING, BulkOperationState.CANCELLED)
    assert op.created < 12 and op.error == "expansion cancelled by olga: too wide"
    run_all(worker)
    op = envelope(op_id)
    assert (op.state, op.skipped, op.done) == (BulkOperationState.CANCELLED, op.created, 0)
    assert effects("bulk-") == []


def test_cancelling_an_expansion_midway_skips_the_units_not_yet_run(effects, settings):
    settings.VPAY_BULK_PAGE_SIZE = 10
    letters(35)
    op_id = submit()
    with pytest.raises(SystemExit):
        expand_once(crash_after_pages=2)  # 20 units created, then the worker dies
    execute("UPDATE jobs SET locked_at = NULL, locked_by = NULL, lease_token = NULL, lease_expires_at = NULL")
    cancel_expansion(op_id)
    assert envelope(op_id).state == BulkOperationState.CANCELLING  # its 20 units are still waiting
    run_all()
    op = envelope(op_id)
    assert (op.state, op.created, op.done, op.skipped) == (BulkOperationState.CANCELLED, 20, 0, 20)
    assert op.finished_at is not None
    assert effects("bulk-") == []
    item = BulkItem.objects.filter(operation_id=op_id).first()
    assert (item.state, item.note) == (BulkItemState.SKIPPED, "the operation was cancelled before this item ran")


def test_discarding_a_dead_lettered_expansion_cancels_the_operation():
    letters(3)
    op_id = submit()
    # Its retries spent (the database away for long): a pending letter, still resumable.
    execute("UPDATE jobs SET attempts = max_attempts - 1 WHERE dedupe_key = %s", [f"bulk:{op_id}:expand"])
    (job,) = claim("worker-gone", batch=1).jobs
    execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job.id])
    reap()
    letter = DeadLetter.objects.get(job_id=job.job_id)
    assert envelope(op_id).state == BulkOperationState.EXPANDING  # a replay would resume it
    assert dead_letters.dead_letter_discard(letter_id=letter.pk, actor="omar", reason="not needed").done
    op = envelope(op_id)
    assert op.state == BulkOperationState.CANCELLED
    assert op.error == f"expansion dead letter #{letter.pk} discarded by omar: not needed"


def cancel_on_own_connection(job_id) -> None:
    try:
        cancels.job_cancel(job_id=job_id, actor="olga", reason="too wide")
    finally:
        connection.close()


def kill_one_unit(op_id: int) -> tuple[int, DeadLetter]:
    """A unit's worker dies on its last attempt: the reaper dead-letters it (crashed_worker)."""
    item_id = scalar("SELECT min(item_id) FROM bulk_items WHERE operation_id = %s", [op_id])
    execute("UPDATE jobs SET max_attempts = 1 WHERE dedupe_key = %s", [f"bulk:{op_id}:{item_id}"])
    execute("UPDATE jobs SET priority = -1000 WHERE dedupe_key = %s", [f"bulk:{op_id}:{item_id}"])
    (job,) = claim("worker-gone", batch=1).jobs
    assert job.payload["item_id"] == item_id
    execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job.id])
    reap()
    return item_id, DeadLetter.objects.get(job_id=job.job_id)


def test_a_dead_lettered_unit_is_counted_failed_and_the_operation_still_finishes(effects):
    letters(3)
    op_id = submit()
    expand_once()
    item_id, letter = kill_one_unit(op_id)
    assert letter.cause == "crashed_worker"
    run_all()
    op = envelope(op_id)
    assert (op.state, op.created, op.done, op.failed) == (BulkOperationState.DONE, 3, 2, 1)
    assert op.finished_at is not None
    item = BulkItem.objects.get(operation_id=op_id, item_id=item_id)
    assert item.state == BulkItemState.FAILED
    assert item.note.startswith(f"dead letter #{letter.pk} (crashed_worker): ")
    assert len(effects("bulk-")) == 2


def test_the_last_unit_dead_lettered_finishes_a_running_operation_and_its_replay_counts_it_again(effects):
    letters(2)
    op_id = submit()
    expand_once()
    run_one = scalar("SELECT max(item_id) FROM bulk_items WHERE operation_id = %s", [op_id])
    execute("UPDATE jobs SET priority = -1000 WHERE dedupe_key = %s", [f"bulk:{op_id}:{run_one}"])
    assert Worker(concurrency=1).run_once() == 1  # one unit done; the operation is running
    assert envelope(op_id).state == BulkOperationState.RUNNING
    item_id, letter = kill_one_unit(op_id)
    op = envelope(op_id)
    assert (op.state, op.done, op.failed) == (BulkOperationState.DONE, 1, 1)
    # The operator replays the unit's letter: the item gets its effect and is counted done.
    assert dead_letters.dead_letter_replay(letter_id=letter.pk, actor="omar").done
    run_all()
    op = envelope(op_id)
    assert (op.state, op.done, op.failed) == (BulkOperationState.DONE, 2, 0)
    assert BulkItem.objects.get(operation_id=op_id, item_id=item_id).state == BulkItemState.DONE
    assert len(effects("bulk-")) == 2
    assert rows("SELECT id FROM jobs WHERE kind = 'bulk_item'") == []


def test_a_unit_cancelled_by_an_operator_is_skipped_and_the_operation_still_finishes(effects):
    letters(2)
    op_id = submit()
    expand_once()
    item_id = scalar("SELECT min(item_id) FROM bulk_items WHERE operation_id = %s", [op_id])
    unit = scalar("SELECT job_id FROM jobs WHERE dedupe_key = %s", [f"bulk:{op_id}:{item_id}"])
    letter_id = cancels.job_cancel(job_id=unit, actor="olga", reason="not this one").dead_letter_id
    run_all()
    op = envelope(op_id)
    assert (op.state, op.done, op.failed, op.skipped) == (BulkOperationState.DONE, 1, 0, 1)
    item = BulkItem.objects.get(operation_id=op_id, item_id=item_id)
    assert (item.state, item.note) == (
        BulkItemState.SKIPPED,
        f"dead letter #{letter_id} (cancelled): cancelled by olga: not this one",
    )
    assert len(effects("bulk-")) == 1
