"""The refund poll's pure tables, exhaustively: the recovery table, the settlement table
read through the refund's states, and the ladder as data."""

from __future__ import annotations

import itertools

import pytest

from charges.recovery import SubmitEvidence
from charges.refund_policy import RefundPolicy, RefundStep, recovery_step, settle_refund
from charges.settlement import Settlement
from charges.states import RailStatus, RefundStatus

POLICY = RefundPolicy(ladder=(30.0, 60.0, 120.0), horizon=100.0, past_horizon_every=3600.0, not_found_window=60.0)


@pytest.mark.parametrize(
    ("submit", "count", "age", "step"),
    [
        # Never sent: send, whatever else (a crash before the POST).
        *((SubmitEvidence.NEVER, c, a, RefundStep.SEND) for c, a in itertools.product((0, 2, 3, 9), (None, 0.0, 60.0))),
        # Sent (answered or not): ask, until a streak of 404s spans the window; both needed.
        *(
            (s, c, a, RefundStep.SEND if c >= 3 and a is not None and a >= 60.0 else RefundStep.ASK)
            for s, c, a in itertools.product(
                (SubmitEvidence.UNANSWERED, SubmitEvidence.ANSWERED), (0, 1, 2, 3, 4), (None, 0.0, 59.9, 60.0, 600.0)
            )
        ),
    ],
)
def test_recovery_step_of_a_submitting_refund(submit, count, age, step):
    assert recovery_step(submit, count, age, POLICY) is step


@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("answer", list(RailStatus))
@pytest.mark.parametrize("status", list(RefundStatus))
def test_the_settlement_table_read_through_the_refund_states(status, answer, past):
    got = settle_refund(status, answer, past_horizon=past)
    if status in (RefundStatus.SUCCEEDED, RefundStatus.FAILED):
        expected = Settlement.IGNORE
    elif answer is RailStatus.SUCCEEDED:
        expected = Settlement.SUCCEED
    elif answer is RailStatus.FAILED:
        expected = Settlement.FAIL
    elif past:
        expected = Settlement.ESCALATE
    elif status is RefundStatus.SUBMITTING and answer is RailStatus.PENDING:
        expected = Settlement.MARK_SUBMITTED  # submitting -> pending
    else:
        expected = Settlement.STAY  # a 404 about a pending refund concludes nothing
    assert got is expected


def test_the_ladder_rises_repeats_its_last_rung_and_goes_hourly_past_the_horizon():
    waits = [POLICY.next_wait(asks, age=10.0) for asks in range(6)]
    assert waits == [30.0, 60.0, 120.0, 120.0, 120.0, 120.0]
    assert POLICY.next_wait(2, age=100.0) == 3600.0
    assert not POLICY.past(99.9) and POLICY.past(100.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"ladder": ()},
        {"ladder": (10.0, 0.0)},
        {"horizon": 0.0},
        {"past_horizon_every": 0.0},
        {"not_found_window": -1.0},
        {"not_found_streak": 0},
    ],
)
def test_a_policy_that_cannot_work_is_refused(bad):
    with pytest.raises(ValueError):
        RefundPolicy(**bad)
