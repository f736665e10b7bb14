"""Each named constraint of the queue's tables, provoked in PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from jobs.models import LAST_ERROR_MAX, DeadLetter, DeadLetterState, Job
from tests.queue_support import count, execute

pytestmark = pytest.mark.django_db


def violated_constraint(create) -> str:
    """Run ``create`` expecting an IntegrityError; return the name of the constraint it broke."""
    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        create()
    return raised.value.__cause__.diag.constraint_name


def dead_letter(**fields) -> DeadLetter:
    defaults = {
        "job_id": uuid.uuid4(),
        "kind": "task",
        "queue": "default",
        "payload": {"task": "x", "args": [], "kwargs": {}},
        "attempts": 1,
        "max_attempts": 5,
        "cause": "permanent",
        "job_created_at": timezone.now(),
    }
    return DeadLetter.objects.create(**{**defaults, **fields})


def job(**fields) -> Job:
    return Job.objects.create(**{"kind": "task", "payload": {}, **fields})


# --- jobs_deadletter_discard_requires_reason ---------------------------------------------------


@pytest.mark.parametrize("reason", [None, "", "   ", "\t \n"], ids=["null", "empty", "spaces", "whitespace"])
def test_discarding_a_dead_letter_without_a_reason_is_rejected_by_the_database(reason):
    assert (
        violated_constraint(
            lambda: dead_letter(
                state=DeadLetterState.DISCARDED, discard_reason=reason, discarded_by="ops", discarded_at=Now()
            )
        )
        == "jobs_deadletter_discard_requires_reason"
    )
    assert count("dead_letters") == 0


@pytest.mark.parametrize("reason", [None, "", "   "], ids=["null", "empty", "spaces"])
def test_updating_a_dead_letter_to_discarded_without_a_reason_is_rejected(reason):
    letter = dead_letter()

    def discard():
        DeadLetter.objects.filter(pk=letter.pk).update(
            state=DeadLetterState.DISCARDED, discard_reason=reason, discarded_by="ops", discarded_at=Now()
        )

    assert violated_constraint(discard) == "jobs_deadletter_discard_requires_reason"
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW


def test_discarding_a_dead_letter_with_a_reason_is_accepted():
    letter = dead_letter(
        state=DeadLetterState.DISCARDED, discard_reason=" duplicate of #12 ", discarded_by="ops", discarded_at=Now()
    )
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.DISCARDED


@pytest.mark.parametrize("state", [DeadLetterState.PENDING_REVIEW, DeadLetterState.REPLAYED])
def test_a_dead_letter_not_discarded_needs_no_reason(state):
    history = {"replayed_at": Now(), "replayed_by": "ops"} if state == DeadLetterState.REPLAYED else {}
    assert dead_letter(state=state, discard_reason=None, **history).pk is not None


# --- jobs_deadletter_replay_recorded, jobs_deadletter_discard_recorded -------------------------


@pytest.mark.parametrize(
    "history", [{}, {"replayed_at": Now()}, {"replayed_by": "ops"}], ids=["neither", "no who", "no when"]
)
def test_a_replayed_dead_letter_without_who_and_when_is_rejected(history):
    assert (
        violated_constraint(lambda: dead_letter(state=DeadLetterState.REPLAYED, **history))
        == "jobs_deadletter_replay_recorded"
    )


@pytest.mark.parametrize(
    "history", [{}, {"discarded_at": Now()}, {"discarded_by": "ops"}], ids=["neither", "no who", "no when"]
)
def test_a_discarded_dead_letter_without_who_and_when_is_rejected(history):
    assert (
        violated_constraint(lambda: dead_letter(state=DeadLetterState.DISCARDED, discard_reason="dup", **history))
        == "jobs_deadletter_discard_recorded"
    )


def test_a_dead_letter_with_an_unknown_state_or_cause_is_rejected():
    assert violated_constraint(lambda: dead_letter(state="lost")) == "jobs_deadletter_state_known"
    assert violated_constraint(lambda: dead_letter(cause="gremlins")) == "jobs_deadletter_cause_known"


# --- jobs -------------------------------------------------------------------------------------


def test_a_job_of_an_undeclared_kind_is_rejected():
    assert violated_constraint(lambda: job(kind="mine_bitcoin")) == "jobs_job_kind_known"


def test_a_job_of_an_undeclared_kind_is_rejected_from_raw_sql_too():
    def insert():
        execute("INSERT INTO jobs (job_id, kind, payload) VALUES (gen_random_uuid(), 'nope', '{}')")

    assert violated_constraint(insert) == "jobs_job_kind_known"


@pytest.mark.parametrize(
    "lease",
    [
        {"locked_at": timezone.now()},
        {"locked_by": "w", "lease_token": uuid.uuid4(), "lease_expires_at": timezone.now()},
        {"locked_at": timezone.now(), "locked_by": "w", "lease_token": uuid.uuid4()},
        {"lease_token": uuid.uuid4()},
    ],
    ids=["locked_at only", "no locked_at", "no expiry", "token only"],
)
def test_a_partial_lease_is_rejected(lease):
    assert violated_constraint(lambda: job(**lease)) == "jobs_job_lease_complete"


def test_a_complete_lease_or_none_is_accepted():
    now = timezone.now()
    job(locked_at=now, locked_by="w", lease_token=uuid.uuid4(), lease_expires_at=now)
    job()
    assert count("jobs") == 2


def test_a_second_live_job_with_the_same_dedupe_key_is_rejected():
    job(dedupe_key="k")
    assert violated_constraint(lambda: job(dedupe_key="k")) == "jobs_job_dedupe_key_unique"


def test_many_jobs_without_a_dedupe_key_are_accepted():
    job()
    job()
    assert count("jobs", "dedupe_key IS NULL") == 2


def test_a_last_error_longer_than_the_bound_is_rejected():
    job(last_error="e" * LAST_ERROR_MAX)
    assert violated_constraint(lambda: job(last_error="e" * (LAST_ERROR_MAX + 1))) == "jobs_job_last_error_bounded"


def test_a_second_live_job_with_the_same_job_id_is_rejected():
    job_id = uuid.uuid4()
    job(job_id=job_id)
    assert violated_constraint(lambda: job(job_id=job_id)) == "jobs_job_job_id_unique"


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"attempts": -1}, "jobs_job_attempts_non_negative"),
        ({"max_attempts": 0}, "jobs_job_max_attempts_positive"),
        ({"deferrals": -1}, "jobs_job_deferrals_non_negative"),
    ],
)
def test_impossible_counters_are_rejected(fields, constraint):
    assert violated_constraint(lambda: job(**fields)) == constraint
