"""Cooperative cancel against real PostgreSQL: the service, the heartbeat, the settles, the
command, and current_job(). The real runworker cases are in tests/test_cancel_process.py."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from jobs import JobCancelled, NoCurrentJob, current_job, registry
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance import liveness
from jobs.models import DeadLetter, DeadLetterState, Job
from jobs.primitives.cancel_decisions import JobPhase, Refusal
from jobs.runner.context import JobContext
from jobs.runner.worker import Worker
from jobs.services import cancels
from jobs.storage import leases
from tests.queue_support import claim, claimed_context, count, execute, expire_lease, one, task_payload


def live_worker(name: str = "worker-a") -> None:
    """A ``workers`` row that just beat, as a running worker's."""
    liveness.worker_heartbeat(liveness.WorkerIdentity(name, "host", 1, 1, "default"), 30)


def cancel(job_id, reason: str = "merchant asked", actor: str = "olga"):
    return cancels.job_cancel(job_id=job_id, actor=actor, reason=reason)


def request_row(job_id) -> tuple:
    return one(
        "SELECT cancel_requested_at IS NOT NULL, cancel_requested_by, cancel_reason FROM jobs WHERE job_id = %s",
        [str(job_id)],
    )


def letter_of(job_id) -> DeadLetter:
    return DeadLetter.objects.get(job_id=job_id)


# --- the operator's cancel -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_waiting_job_is_cancelled_at_once_into_a_closed_dead_letter_with_who_and_why():
    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.record", "x"), correlation_id="c-9")
    result = cancel(job_id)
    assert (result.ended, result.phase) == (True, JobPhase.WAITING)
    letter = letter_of(job_id)
    assert (letter.cause, letter.state, letter.discarded_by, letter.discard_reason) == (
        "cancelled",
        DeadLetterState.DISCARDED,
        "olga",
        "merchant asked",
    )
    assert letter.pk == result.dead_letter_id and letter.correlation_id == "c-9"
    assert count("jobs") == 0 and count("alerts") == 0  # closed letters raise no alert


@pytest.mark.django_db
def test_a_running_job_gets_a_request_on_its_row_and_a_second_cancel_keeps_the_first_ones_who_and_why():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    claim("worker-a")
    first = cancel(job_id, "wrong amount")
    assert (first.ended, first.phase, first.already_requested) == (False, JobPhase.RUNNING, False)
    assert request_row(job_id) == (True, "olga", "wrong amount")
    second = cancel(job_id, "duplicate", actor="omar")
    assert (second.already_requested, second.requested_by) == (True, "olga")
    assert request_row(job_id) == (True, "olga", "wrong amount")
    assert count("dead_letters") == 0


@pytest.mark.django_db
def test_a_running_job_whose_worker_stopped_beating_is_cancelled_at_once_without_waiting_for_the_reaper():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    claim("worker-a")
    execute("UPDATE workers SET heartbeat_at = now() - interval '1 minute' WHERE id = 'worker-a'")
    result = cancel(job_id)
    assert (result.ended, result.phase) == (True, JobPhase.ORPHANED)
    assert "its worker worker-a was dead" in letter_of(job_id).last_error
    assert count("jobs") == 0


@pytest.mark.django_db
def test_a_running_job_whose_lease_ran_out_under_a_worker_that_still_beats_gets_a_request_not_an_end():
    # A lapsed lease is not a death (an outage, a beat that skipped a locked row): the
    # worker still beats, so its handler sees the request at its next heartbeat.
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    claim("worker-a")
    expire_lease(job_id)
    result = cancel(job_id)
    assert (result.ended, result.phase) == (False, JobPhase.RUNNING)
    assert count("jobs") == 1


@pytest.mark.django_db
def test_a_running_job_whose_worker_has_no_workers_row_is_cancelled_at_once_once_its_lease_ran_out():
    # As the reaper judges a holder with no row (pruned, or never beat): by its lease.
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    claim("pruned-worker")
    assert cancel(job_id).phase == JobPhase.RUNNING  # its lease is still valid: a request
    expire_lease(job_id)
    result = cancel(job_id)
    assert (result.ended, result.phase) == (True, JobPhase.ORPHANED)


@pytest.mark.django_db
@pytest.mark.parametrize("running", [False, True])
def test_a_charge_poll_is_refused_waiting_or_running_and_the_refusal_says_to_resolve_the_charge(running):
    job_id = queue.enqueue(JobKind.POLL_CHARGE, {"charge_id": "ch_1"})
    if running:
        live_worker()
        claim("worker-a")
    with pytest.raises(cancels.CancelRefused) as refused:
        cancel(job_id)
    assert refused.value.refusal is Refusal.NOT_CANCELLABLE
    assert "'poll_charge', which cannot be cancelled" in str(refused.value)
    assert "Resolve the charge instead" in str(refused.value)
    assert request_row(job_id) == (False, "", "") and count("dead_letters") == 0


@pytest.mark.django_db
def test_an_unknown_job_a_blank_reason_and_a_malformed_id_are_refused_and_write_nothing():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    with pytest.raises(cancels.CancelRefused, match="is not a live job"):
        cancel(uuid.uuid4())
    with pytest.raises(cancels.CancelRefused, match="needs a reason"):
        cancel(job_id, reason="   ")
    with pytest.raises(ValueError, match="not a job id"):
        cancel("not-a-uuid")
    assert count("jobs") == 1 and count("dead_letters") == 0


def test_a_kind_declared_not_cancellable_must_say_why():
    with pytest.raises(ValueError, match="a reason is given exactly when"):
        registry.register(JobKind.TASK, schema=None, timeout_seconds=1, cancellable=False)(lambda ctx: None)


# --- the heartbeat ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_heartbeat_of_a_handler_that_owns_its_transactions_raises_job_cancelled_once_requested():
    job_id = queue.enqueue(JobKind.SEND_ALERT, {"alert_id": 1})
    live_worker()
    (job,) = claim("worker-a").jobs
    ctx = claimed_context(job)
    assert not ctx.loop_fenced
    ctx.heartbeat()  # nothing requested yet
    cancel(job_id)
    with pytest.raises(JobCancelled) as raised:
        ctx.heartbeat()
    assert raised.value.job_id == job_id


@pytest.mark.django_db
def test_a_loop_fenced_handlers_heartbeat_reads_the_request_without_writing_its_row():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    (job,) = claim("worker-a").jobs
    ctx = JobContext(job, 60, loop_fenced=True)
    before = one("SELECT heartbeat_at, lease_expires_at FROM jobs WHERE job_id = %s", [str(job_id)])
    ctx.heartbeat()
    cancel(job_id)
    with pytest.raises(JobCancelled):
        ctx.heartbeat()
    assert one("SELECT heartbeat_at, lease_expires_at FROM jobs WHERE job_id = %s", [str(job_id)]) == before


def test_current_job_outside_a_job_says_so():
    with pytest.raises(NoCurrentJob, match="only available inside a job"):
        current_job()


# --- a run under a cancel request, through the worker loop ----------------------------------------


def run_one_task(path: str, *args) -> tuple[uuid.UUID, Worker]:
    job_id = queue.enqueue(JobKind.TASK, task_payload(path, *args))
    worker = Worker(worker_id="w-cancel", concurrency=1)
    worker.heartbeat()  # its workers row: a live worker, so a cancel is a request
    assert worker.run_once() == 1
    return job_id, worker


@pytest.mark.django_db(transaction=True)
def test_a_task_that_heartbeats_after_the_request_ends_cancelled_and_its_effects_roll_back(effects):
    job_id, worker = run_one_task("tests.tasks.cancelled_while_running", "obeys", "heartbeat")
    letter = letter_of(job_id)
    assert (letter.cause, letter.state, letter.discarded_by, letter.discard_reason) == (
        "cancelled",
        DeadLetterState.DISCARDED,
        "olga",
        "stop obeys",
    )
    assert "while it ran" in letter.last_error
    assert effects("obeys") == [] and count("jobs") == 0
    assert (worker.report().cancelled, worker.report().lost) == (1, 0)


def overtaken_lines(caplog) -> list[tuple]:
    return [
        (r.job_id, r.cancel_requested_by, r.cancel_reason)
        for r in caplog.records
        if r.getMessage().startswith("cancel request overtaken")
    ]


@pytest.mark.django_db(transaction=True)
def test_a_task_that_finishes_before_its_next_heartbeat_keeps_its_answer_and_the_request_is_overtaken(effects, caplog):
    job_id, worker = run_one_task("tests.tasks.cancelled_while_running", "finishes", "return")
    assert effects("finishes") == [("finishes", "")]
    assert not DeadLetter.objects.filter(job_id=job_id).exists() and count("jobs") == 0
    assert worker.report().finished == 1
    # The row that held who asked and why is gone: the log line is the request's record.
    assert overtaken_lines(caplog) == [(str(job_id), "olga", "stop finishes")]


@pytest.mark.django_db
def test_a_finish_acknowledged_by_the_completer_records_the_request_it_overtook(caplog):
    from jobs.runner.report import Report
    from jobs.runner.settling import Settler

    asked = queue.enqueue(JobKind.TASK, task_payload())
    quiet = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    jobs = claim("worker-a", batch=2).jobs
    cancel(asked, "wrong amount")
    Settler(Report()).finish(jobs)  # as the completer acknowledges a batch
    assert count("jobs") == 0
    assert overtaken_lines(caplog) == [(str(asked), "olga", "wrong amount")]
    assert str(quiet) not in {line[0] for line in overtaken_lines(caplog)}


@pytest.mark.django_db(transaction=True)
def test_a_task_that_fails_after_the_request_is_not_retried_but_ends_cancelled(effects):
    job_id, worker = run_one_task("tests.tasks.cancelled_while_running", "fails", "fail")
    assert letter_of(job_id).cause == "cancelled" and count("jobs") == 0
    assert (worker.report().cancelled, worker.report().retried, worker.report().lost) == (1, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_error_nobody_asked_for_is_an_ordinary_failure_and_retried():
    job_id, worker = run_one_task("tests.tasks.raise_job_cancelled_unasked")
    assert worker.report().retried == 1 and not DeadLetter.objects.filter(job_id=job_id).exists()
    assert Job.objects.get(job_id=job_id).attempts == 1


@pytest.mark.django_db
def test_a_run_handed_back_under_a_request_is_ended_by_the_next_reap_not_run_again():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    (job,) = claim("worker-a").jobs
    cancel(job_id, "stop it")
    leases.release([(job.id, job.lease_token)], refund=True)  # as when the database went away under it
    assert count("jobs", "locked_at IS NULL") == 1
    Worker(concurrency=1).reap()
    letter = letter_of(job_id)
    assert (letter.cause, letter.discarded_by, letter.discard_reason) == ("cancelled", "olga", "stop it")
    assert count("jobs") == 0


# --- manage.py jobs cancel -------------------------------------------------------------------


@pytest.mark.django_db
def test_the_command_cancels_a_waiting_job_by_its_tasks_result_id():
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    out = StringIO()
    call_command("jobs", "cancel", str(job_id), "--reason", "merchant asked", stdout=out)
    assert "cancelled: dead letter #" in out.getvalue()
    assert letter_of(job_id).discarded_by.startswith("shell:")


@pytest.mark.django_db
def test_the_command_refuses_a_bad_id_an_unknown_id_a_blank_reason_and_a_charge_poll_with_clear_errors():
    poll = queue.enqueue(JobKind.POLL_CHARGE, {"charge_id": "ch_1"})
    with pytest.raises(CommandError, match="is not a job id"):
        call_command("jobs", "cancel", "42", "--reason", "x")
    with pytest.raises(CommandError, match="is not a live job"):
        call_command("jobs", "cancel", str(uuid.uuid4()), "--reason", "x")
    with pytest.raises(CommandError, match="needs a reason"):
        call_command("jobs", "cancel", str(poll), "--reason", " ")
    with pytest.raises(CommandError, match="Resolve the charge instead"):
        call_command("jobs", "cancel", str(poll), "--reason", "stuck")
    with pytest.raises(CommandError, match="no such user"):
        call_command("jobs", "cancel", str(poll), "--reason", "stuck", "--user", "nobody")
    assert count("dead_letters") == 0


@pytest.mark.django_db
@pytest.mark.parametrize("suspect", [False, True], ids=["ordinary", "suspect"])
def test_a_free_job_whose_cancel_was_requested_is_never_claimed_again(suspect):
    # Rescued from a dead worker or handed back with its request on the row: the cancel
    # sweep ends it. A claim woken by the rescue's NOTIFY must not run it again first.
    job_id = queue.enqueue(JobKind.TASK, task_payload())
    live_worker()
    claim("worker-a")
    cancel(job_id, "stop it")
    execute(
        "UPDATE jobs SET locked_at = NULL, locked_by = NULL, lease_token = NULL, lease_expires_at = NULL,"
        " crashes = %s WHERE job_id = %s",
        [1 if suspect else 0, job_id],
    )
    assert claim("worker-b").jobs == []
    taken = leases.claim_suspect(
        worker="worker-b",
        queues=["default"],
        kinds=[JobKind.TASK.value],
        lease_seconds=30.0,
        kind_leases={},
        default_lease=30.0,
    )
    assert taken is None
    assert not leases.suspect_waiting(["default"], [JobKind.TASK.value])
    worker = Worker(worker_id="worker-b", concurrency=1)
    assert worker.run_once() == 0
