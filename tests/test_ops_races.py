"""The console's guards under real concurrency: two connections replaying one dead letter,
and a cancel racing a worker's claim. Committed transactions (``transaction=True``)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from jobs.adapters import postgres as queue
from jobs.maintenance import liveness
from jobs.models import DeadLetter, DeadLetterState
from jobs.primitives.cancel_decisions import JobPhase
from jobs.services import cancels
from jobs.services import dead_letters as ops
from tests.conftest import wait_for
from tests.factories.jobs import DeadLetterFactory
from tests.queue_support import claim, count, scalar, task_payload

# Lock waits in this test's database only (another xdist worker's database shares the server).
WAITING_HERE = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE NOT l.granted AND a.datname = current_database()"
)


def cancel_waits() -> bool:
    """Whether a session of this database waits on a lock, asked from inside the claim's
    transaction: pg_stat_activity is read once per transaction and kept unless cleared, and
    the cancel's session may have connected after the first look."""
    scalar("SELECT pg_stat_clear_snapshot()")
    return scalar(WAITING_HERE) > 0


pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(*functions) -> list:
    """Run each function on its own thread (its own database connection); their results."""
    results: list = [None] * len(functions)
    errors: list[BaseException] = []

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(functions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    return results


def test_two_operators_replaying_the_same_letter_at_once_enqueue_it_once():
    letter = DeadLetterFactory()
    barrier = threading.Barrier(2)

    def replay(actor):
        def go():
            barrier.wait(5)
            return ops.dead_letter_replay(letter_id=letter.pk, actor=actor)

        return go

    results = in_threads(replay("olga"), replay("omar"))
    assert sorted(r.done for r in results) == [False, True]
    (loser,) = [r for r in results if not r.done]
    assert loser.refusal == ops.Refusal.ALREADY_REPLAYED
    assert count("jobs", "job_id = %s", [letter.job_id]) == 1
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.REPLAYED and letter.replayed_by in {"olga", "omar"}


def test_a_cancel_waiting_on_a_claim_in_flight_becomes_a_request_once_the_claim_commits():
    job_id = queue.enqueue("task", task_payload(), correlation_id="race")
    liveness.worker_heartbeat(liveness.WorkerIdentity("worker-a", "host", 1, 1, "default"), 30)  # the claimant lives
    claim_holds_the_row = threading.Event()
    cancel_is_waiting = threading.Event()

    def worker_claims():
        with transaction.atomic():
            (claimed,) = claim().jobs  # the claim's UPDATE holds the row lock until commit
            claim_holds_the_row.set()
            wait_for(cancel_is_waiting.is_set, timeout=10)
            # Give the cancel's row lock time to queue behind ours.
            wait_for(cancel_waits, timeout=10)
        return claimed.job_id

    def operator_cancels():
        claim_holds_the_row.wait(10)
        cancel_is_waiting.set()
        return cancels.job_cancel(job_id=job_id, actor="olga", reason="wrong amount")

    claimed_id, result = in_threads(worker_claims, operator_cancels)
    assert claimed_id == job_id
    # The cancel read the committed row (now leased by a live worker): a request, not a delete.
    assert (result.ended, result.phase) == (False, JobPhase.RUNNING)
    assert count("jobs", "job_id = %s AND locked_at IS NOT NULL AND cancel_requested_by = 'olga'", [job_id]) == 1
    assert not DeadLetter.objects.filter(job_id=job_id).exists()
