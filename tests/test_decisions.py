"""jobs.runner.decisions, cell by cell: a handler's answer (or error) to exactly one settle."""

from __future__ import annotations

import random

import pytest
from django.db import OperationalError

from jobs.models import DeadLetterCause
from jobs.primitives.retry import RetryPolicy
from jobs.runner.decisions import (
    UNRUNNABLE_RETRY_SECONDS,
    AttemptsChange,
    Disposition,
    JobState,
    Settle,
    settle_error,
    settle_outcome,
    settle_unrunnable,
)
from jobs.runner.outcome import Action, Outcome
from vpay.errors import (
    Category,
    Classification,
    ConfigurationError,
    DeferError,
    PermanentError,
    PoisonError,
    Retry,
    Severity,
    TransientError,
    VpayError,
    classify,
)

POLICY = RetryPolicy(max_attempts=5, base_seconds=30.0, cap_seconds=3600.0)


def state(attempts: int = 1, max_attempts: int = 5, deferrals: int = 0, max_deferrals: int = 10) -> JobState:
    return JobState(attempts=attempts, max_attempts=max_attempts, deferrals=deferrals, max_deferrals=max_deferrals)


# --- settle_outcome ------------------------------------------------------------------------

# Every Action, below the attempt and deferral limits.
OUTCOME_TABLE = {
    Action.DONE: (Outcome.done(), Settle(Disposition.FINISHED)),
    Action.RETRY: (
        Outcome.retry_after(12, "rate limited by the far side"),
        Settle(
            Disposition.RETRIED,
            12.0,
            AttemptsChange.KEEP,
            error="rate limited by the far side",
            error_category=Category.TRANSIENT,
        ),
    ),
    Action.RESCHEDULE: (
        Outcome.reschedule_in(60, "poll again"),
        Settle(Disposition.RESCHEDULED, 60.0, AttemptsChange.RESET, error="poll again"),
    ),
    Action.DEFER: (
        Outcome.defer(7, "breaker open"),
        Settle(
            Disposition.DEFERRED,
            7.0,
            AttemptsChange.REFUND,
            add_deferral=True,
            error="breaker open",
            error_category=Category.DEFERRED,
        ),
    ),
}


def test_the_outcome_table_covers_every_action():
    assert set(OUTCOME_TABLE) == set(Action)


@pytest.mark.parametrize("action", list(Action), ids=str)
def test_settle_outcome__below_every_limit_maps_each_action_to_its_own_settle(action):
    outcome, expected = OUTCOME_TABLE[action]
    assert settle_outcome(outcome, state(attempts=2)) == expected


@pytest.mark.parametrize("attempts", [5, 6])
def test_settle_outcome__retry_at_or_past_max_attempts_dead_letters_as_exhausted(attempts):
    settle = settle_outcome(Outcome.retry_after(5, "still failing"), state(attempts=attempts, max_attempts=5))
    assert settle == Settle(
        Disposition.DEAD_LETTERED,
        cause=DeadLetterCause.EXHAUSTED,
        error="still failing",
        error_category=Category.TRANSIENT,
    )


def test_settle_outcome__retry_one_below_max_attempts_still_retries():
    settle = settle_outcome(Outcome.retry_after(5, "x"), state(attempts=4, max_attempts=5))
    assert settle.disposition is Disposition.RETRIED
    assert settle.attempts is AttemptsChange.KEEP


@pytest.mark.parametrize("attempts", [1, 5, 9])
def test_settle_outcome__reschedule_is_not_a_failure_even_on_the_last_attempt(attempts):
    settle = settle_outcome(Outcome.reschedule_in(30), state(attempts=attempts, max_attempts=5))
    # A reschedule resets attempts: a polling job is never exhausted by polling.
    assert settle == Settle(Disposition.RESCHEDULED, 30.0, AttemptsChange.RESET)


@pytest.mark.parametrize("attempts", [1, 5, 9])
def test_settle_outcome__done_finishes_whatever_the_attempt(attempts):
    assert settle_outcome(Outcome.done(), state(attempts=attempts)) == Settle(Disposition.FINISHED)


def test_settle_outcome__defer_one_below_the_ceiling_still_defers():
    settle = settle_outcome(Outcome.defer(3, "busy"), state(deferrals=9, max_deferrals=10))
    assert settle.disposition is Disposition.DEFERRED
    assert settle.add_deferral is True
    assert settle.attempts is AttemptsChange.REFUND


@pytest.mark.parametrize("deferrals", [10, 11])
def test_settle_outcome__defer_at_or_past_the_ceiling_dead_letters(deferrals):
    settle = settle_outcome(Outcome.defer(3, "breaker open"), state(deferrals=deferrals, max_deferrals=10))
    assert settle.disposition is Disposition.DEAD_LETTERED
    assert settle.cause is DeadLetterCause.DEFERRAL_CEILING
    assert settle.error_category == Category.DEFERRED
    # The error says how often and why, for the operator reading the dead letter.
    assert f"deferred {deferrals} times (ceiling 10)" in settle.error
    assert settle.error.endswith("last: breaker open")


def test_settle_outcome__defer_ignores_the_attempt_limit():
    # A deferral spends no attempt, so being on the last attempt does not end the job.
    settle = settle_outcome(Outcome.defer(3, "busy"), state(attempts=5, max_attempts=5))
    assert settle.disposition is Disposition.DEFERRED


# --- settle_error: dead-letter classifications --------------------------------------------

DEAD_LETTER_CAUSE_BY_CATEGORY = {
    Category.POISON: DeadLetterCause.POISON,
    Category.PERMANENT: DeadLetterCause.PERMANENT,
    Category.CONFIGURATION: DeadLetterCause.CONFIGURATION,
    # Categories without a cause of their own fall back to "permanent".
    Category.TRANSIENT: DeadLetterCause.PERMANENT,
    Category.DEFERRED: DeadLetterCause.PERMANENT,
    Category.BUG: DeadLetterCause.PERMANENT,
}


def test_the_dead_letter_cause_table_covers_every_category():
    assert set(DEAD_LETTER_CAUSE_BY_CATEGORY) == set(Category)


@pytest.mark.parametrize("category", list(Category), ids=str)
def test_settle_error__a_dead_letter_classification_dead_letters_on_the_first_attempt_with_its_cause(category):
    classification = Classification(category, Severity.ERROR, Retry.DEAD_LETTER)
    settle = settle_error(classification, "boom", state(attempts=1, max_attempts=5), POLICY)
    assert settle == Settle(
        Disposition.DEAD_LETTERED,
        cause=DEAD_LETTER_CAUSE_BY_CATEGORY[category],
        error="boom",
        error_category=category,
    )


# --- settle_error: backoff -----------------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 2, 3, 4])
def test_settle_error__backoff_below_max_attempts_retries_within_the_policy_ceiling(attempts):
    classification = TransientError.classification
    settle = settle_error(classification, "timeout", state(attempts=attempts), POLICY, rng=random.Random(attempts))
    assert settle.disposition is Disposition.RETRIED
    assert settle.attempts is AttemptsChange.KEEP
    assert settle.add_deferral is False
    assert settle.cause is None
    assert settle.error == "timeout"
    assert settle.error_category == Category.TRANSIENT
    # The delay is the policy's full-jitter backoff for this attempt, drawn from the rng given.
    assert 0.0 <= settle.delay <= POLICY.ceiling(attempts)
    assert settle.delay == POLICY.backoff(attempts, random.Random(attempts))


@pytest.mark.parametrize("attempts", [5, 6])
def test_settle_error__backoff_at_or_past_max_attempts_dead_letters_as_exhausted(attempts):
    settle = settle_error(VpayError.classification, "bug", state(attempts=attempts), POLICY)
    assert settle == Settle(
        Disposition.DEAD_LETTERED, cause=DeadLetterCause.EXHAUSTED, error="bug", error_category=Category.BUG
    )


def test_settle_error__backoff_with_a_single_attempt_policy_dead_letters_at_once():
    settle = settle_error(
        TransientError.classification, "x", state(attempts=1, max_attempts=1), RetryPolicy(max_attempts=1)
    )
    assert settle.cause is DeadLetterCause.EXHAUSTED


# --- settle_error: defer -------------------------------------------------------------------


def test_settle_error__defer_below_the_ceiling_requeues_after_the_given_delay_without_spending_an_attempt():
    settle = settle_error(
        DeferError.classification, "breaker open", state(attempts=5, deferrals=3), POLICY, defer_seconds=42.0
    )
    assert settle == Settle(
        Disposition.DEFERRED,
        42.0,
        AttemptsChange.REFUND,
        add_deferral=True,
        error="breaker open",
        error_category=Category.DEFERRED,
    )


@pytest.mark.parametrize("deferrals", [10, 11])
def test_settle_error__defer_at_or_past_the_ceiling_dead_letters(deferrals):
    settle = settle_error(
        DeferError.classification, "breaker open", state(deferrals=deferrals, max_deferrals=10), POLICY
    )
    assert settle.disposition is Disposition.DEAD_LETTERED
    assert settle.cause is DeadLetterCause.DEFERRAL_CEILING
    assert settle.error_category == Category.DEFERRED


# --- the error vocabulary through the table ------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "disposition", "cause", "category"),
    [
        (TransientError("t"), Disposition.RETRIED, None, Category.TRANSIENT),
        (OperationalError("server closed the connection"), Disposition.RETRIED, None, Category.TRANSIENT),
        (TimeoutError("read timed out"), Disposition.RETRIED, None, Category.TRANSIENT),
        (ValueError("unexpected"), Disposition.RETRIED, None, Category.BUG),
        (DeferError("breaker"), Disposition.DEFERRED, None, Category.DEFERRED),
        (PermanentError("refused"), Disposition.DEAD_LETTERED, DeadLetterCause.PERMANENT, Category.PERMANENT),
        (PoisonError("bad payload"), Disposition.DEAD_LETTERED, DeadLetterCause.POISON, Category.POISON),
        (
            ConfigurationError("bad key"),
            Disposition.DEAD_LETTERED,
            DeadLetterCause.CONFIGURATION,
            Category.CONFIGURATION,
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_settle_error__each_error_class_lands_in_its_row_of_the_table(exc, disposition, cause, category):
    settle = settle_error(classify(exc), str(exc), state(attempts=1), POLICY, rng=random.Random(0))
    assert (settle.disposition, settle.cause, settle.error_category) == (disposition, cause, category)


# --- a job this worker cannot run (jobs.runner.decisions.settle_unrunnable) ----------------------------

UNRUNNABLE_CASES = {
    # (window, unrunnable_for): disposition
    (900.0, None): Disposition.UNRUNNABLE,  # the first worker that cannot run it
    (900.0, 0.0): Disposition.UNRUNNABLE,
    (900.0, 899.9): Disposition.UNRUNNABLE,
    (900.0, 900.0): Disposition.DEAD_LETTERED,  # no worker could run it for the whole window
    (900.0, 5000.0): Disposition.DEAD_LETTERED,
    (0.0, None): Disposition.DEAD_LETTERED,  # no other process could ever run it
    (0.0, 10.0): Disposition.DEAD_LETTERED,
}


@pytest.mark.parametrize(("window", "unrunnable_for"), list(UNRUNNABLE_CASES), ids=str)
def test_settle_unrunnable_is_exhaustive_over_the_window_and_the_wait(window, unrunnable_for):
    settle = settle_unrunnable("task 'x' cannot be imported", unrunnable_for, window)
    assert settle.disposition is UNRUNNABLE_CASES[(window, unrunnable_for)]
    if settle.disposition is Disposition.UNRUNNABLE:
        # Left for a worker that can: no attempt spent, offered again soon, never at once.
        assert (settle.attempts, settle.delay) == (AttemptsChange.REFUND, UNRUNNABLE_RETRY_SECONDS)
        assert settle.cause is None
        assert "left for a worker that can" in settle.error
    else:
        assert (settle.cause, settle.error_category) == (DeadLetterCause.POISON, "poison")
        assert settle.error.startswith("task 'x' cannot be imported")
        assert ("no worker could run it" in settle.error) == (window > 0)
