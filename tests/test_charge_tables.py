"""The pure tables of the charge worker, cell by cell: settlement, crash recovery, the poll
ladder, the horizon, and the policy's own validation. No database, no clock."""

from __future__ import annotations

import itertools

import pytest

from charges.ladder import past_the_horizon, poll_delay
from charges.policy import DEFAULT_LADDER, RecoveryPolicy
from charges.recovery import Evidence, RecoveryAction, Step, SubmitEvidence, recovery_step
from charges.settlement import Settlement, settle
from charges.states import ChargeStatus, RailFlow, RailStatus

S = ChargeStatus
R = RailStatus

# --- settle ---------------------------------------------------------------------------

# Every cell of the table, written out: (charge status, answer) -> (before, past) the horizon.
SETTLE_TABLE = {
    (S.SUBMITTING, R.SUCCEEDED): (Settlement.SUCCEED, Settlement.SUCCEED),
    (S.SUBMITTING, R.FAILED): (Settlement.FAIL, Settlement.FAIL),
    (S.SUBMITTING, R.PENDING): (Settlement.MARK_SUBMITTED, Settlement.ESCALATE),
    (S.SUBMITTING, R.NOT_FOUND): (Settlement.STAY, Settlement.ESCALATE),
    (S.SUBMITTING, R.UNAVAILABLE): (Settlement.STAY, Settlement.ESCALATE),
    (S.SUBMITTED, R.SUCCEEDED): (Settlement.SUCCEED, Settlement.SUCCEED),
    (S.SUBMITTED, R.FAILED): (Settlement.FAIL, Settlement.FAIL),
    (S.SUBMITTED, R.PENDING): (Settlement.STAY, Settlement.ESCALATE),
    (S.SUBMITTED, R.NOT_FOUND): (Settlement.STAY, Settlement.ESCALATE),
    (S.SUBMITTED, R.UNAVAILABLE): (Settlement.STAY, Settlement.ESCALATE),
    (S.UNRESOLVED, R.SUCCEEDED): (Settlement.SUCCEED, Settlement.SUCCEED),
    (S.UNRESOLVED, R.FAILED): (Settlement.FAIL, Settlement.FAIL),
    (S.UNRESOLVED, R.PENDING): (Settlement.STAY, Settlement.ESCALATE),
    (S.UNRESOLVED, R.NOT_FOUND): (Settlement.STAY, Settlement.ESCALATE),
    (S.UNRESOLVED, R.UNAVAILABLE): (Settlement.STAY, Settlement.ESCALATE),
    # Manual capture: the rail's authorization is final for this table, at any age; a charge
    # the rail dropped before anyone captured it ("canceled") failed.
    **{
        (live, answer): (outcome, outcome)
        for live in (S.SUBMITTING, S.SUBMITTED, S.UNRESOLVED)
        for answer, outcome in ((R.AUTHORIZED, Settlement.AUTHORIZE), (R.CANCELED, Settlement.FAIL))
    },
    # Terminal, and the capture phase (charges.capture_table's): nothing here.
    **{
        (other, answer): (Settlement.IGNORE, Settlement.IGNORE)
        for other in (S.SUCCEEDED, S.FAILED, S.VOIDED, S.AUTHORIZED, S.CAPTURING, S.VOIDING)
        for answer in R
    },
}


def test_the_settlement_table_covers_every_status_and_answer():
    assert set(SETTLE_TABLE) == set(itertools.product(S, R))


@pytest.mark.parametrize(("status", "answer"), sorted(SETTLE_TABLE))
def test_settle__each_cell(status, answer):
    before, past = SETTLE_TABLE[(status, answer)]
    assert settle(status, answer, past_horizon=False) is before
    assert settle(status, answer, past_horizon=True) is past


def test_settle__a_late_success_of_an_unresolved_charge_settles_it():
    # Minute 40 or hour 30: a late answer is the normal way an unresolved charge ends.
    assert settle(S.UNRESOLVED, R.SUCCEEDED, past_horizon=True) is Settlement.SUCCEED


def test_settle__accepts_the_database_spellings():
    assert settle("submitted", "succeeded", past_horizon=False) is Settlement.SUCCEED


# --- recovery_step ----------------------------------------------------------------------

POLICY = RecoveryPolicy(not_found_window=60.0, not_found_streak=3)


def ev(age, flow=RailFlow.PUSH, submit=SubmitEvidence.UNANSWERED, count=0, nf_age=None):
    return Evidence(age=age, flow=flow, submit=submit, not_found_count=count, not_found_age=nf_age)


EVERY_SHAPE_OF_EVIDENCE = [
    (flow, submit, count, nf_age)
    for flow in RailFlow
    for submit in SubmitEvidence
    for count, nf_age in ((0, None), (1, 0.0), (3, 10.0), (3, 60.0), (10, 3600.0))
]


@pytest.mark.parametrize(("flow", "submit", "count", "nf_age"), EVERY_SHAPE_OF_EVIDENCE)
def test_a_young_charge_is_left_alone_on_every_shape_of_evidence(flow, submit, count, nf_age):
    # Younger than the window a confirm may still be inside its rail call: every branch
    # but Wait would move the charge out from under it.
    action = recovery_step(ev(59.0, flow, submit, count, nf_age), POLICY)
    assert action == RecoveryAction(Step.WAIT, pytest.approx(1.0))


@pytest.mark.parametrize(
    ("age", "expected_wait"),
    [
        (0.0, 60.0),  # the whole window
        (0.5, 59.5),
        (45.0, 15.0),
        (59.999, 0.001),  # exactly the rest, not a rung of the ladder
        (-5.0, 60.0),  # created_at ahead of the database's now(): one window, not window + skew
        (-100000.0, 60.0),
    ],
)
def test_nothing_younger_than_the_window_is_recovered__waits_exactly_the_rest_clamped(age, expected_wait):
    action = recovery_step(ev(age, RailFlow.REDIRECT, SubmitEvidence.NEVER), POLICY)
    assert action.step is Step.WAIT
    assert action.wait_seconds == pytest.approx(expected_wait)
    assert 0.0 <= action.wait_seconds <= POLICY.not_found_window


@pytest.mark.parametrize("submit", list(SubmitEvidence))
@pytest.mark.parametrize(("count", "nf_age"), [(0, None), (5, 3600.0)])
@pytest.mark.parametrize("age", [60.0, 61.0, 86400.0 * 3])
def test_a_redirect_charge_still_submitting_past_the_window_is_a_dead_order(submit, count, nf_age, age):
    assert recovery_step(ev(age, RailFlow.REDIRECT, submit, count, nf_age), POLICY).step is Step.FAIL_DEAD_ORDER


def test_the_window_boundary_is_inclusive_of_recovery():
    assert recovery_step(ev(60.0, RailFlow.REDIRECT), POLICY).step is Step.FAIL_DEAD_ORDER
    assert recovery_step(ev(59.9999, RailFlow.REDIRECT), POLICY).step is Step.WAIT


@pytest.mark.parametrize(("count", "nf_age"), [(0, None), (1, 1.0), (3, 100.0)])
def test_a_push_charge_never_sent_is_resubmitted(count, nf_age):
    assert (
        recovery_step(ev(61.0, submit=SubmitEvidence.NEVER, count=count, nf_age=nf_age), POLICY).step is Step.RESUBMIT
    )


# (submit evidence, 404 count, seconds since the first 404) -> step, for a push charge past the window.
PUSH_TABLE = [
    (SubmitEvidence.UNANSWERED, 0, None, Step.POLL),
    (SubmitEvidence.UNANSWERED, 1, 0.0, Step.POLL),
    (SubmitEvidence.UNANSWERED, 2, 120.0, Step.POLL),  # window, no streak
    (SubmitEvidence.UNANSWERED, 3, 59.9, Step.POLL),  # streak, no window
    (SubmitEvidence.UNANSWERED, 3, 60.0, Step.RESUBMIT),  # both
    (SubmitEvidence.UNANSWERED, 50, 3600.0, Step.RESUBMIT),
    (SubmitEvidence.UNANSWERED, 50, 1.0, Step.POLL),  # many fast 404s still are not a window
    (SubmitEvidence.ANSWERED, 0, None, Step.POLL),
    (SubmitEvidence.ANSWERED, 2, 120.0, Step.POLL),
    (SubmitEvidence.ANSWERED, 3, 59.9, Step.POLL),
    (SubmitEvidence.ANSWERED, 3, 60.0, Step.RESUBMIT),
    (SubmitEvidence.ANSWERED, 3, None, Step.POLL),  # a count without a first-seen instant is not a window
]


@pytest.mark.parametrize(("submit", "count", "nf_age", "expected"), PUSH_TABLE)
def test_push_recovery__streak_and_window_are_both_required(submit, count, nf_age, expected):
    assert recovery_step(ev(600.0, RailFlow.PUSH, submit, count, nf_age), POLICY).step is expected


def test_recovery_uses_the_policy_it_is_given__milliseconds_work_the_same_way():
    fast = RecoveryPolicy(not_found_window=0.05, not_found_streak=2)
    assert recovery_step(ev(0.01), fast) == RecoveryAction(Step.WAIT, pytest.approx(0.04))
    assert recovery_step(ev(0.06, count=2, nf_age=0.05), fast).step is Step.RESUBMIT
    assert recovery_step(ev(0.06, count=2, nf_age=0.049), fast).step is Step.POLL


# --- poll_delay and the horizon ---------------------------------------------------------


@pytest.mark.parametrize(
    ("polls", "delay"),
    [(-1, 10.0), (0, 10.0), (1, 20.0), (2, 30.0), (3, 60.0), (6, 120.0), (12, 3600.0), (13, 3600.0), (10_000, 3600.0)],
)
def test_poll_delay__the_ladder_rises_and_its_last_rung_repeats(polls, delay):
    assert poll_delay(polls, RecoveryPolicy()) == delay


def test_poll_delay__never_falls():
    delays = [poll_delay(n, RecoveryPolicy()) for n in range(30)]
    assert delays == sorted(delays)
    assert delays[0] == 10.0 and delays[1] == 20.0


@pytest.mark.parametrize("polls", [0, 1, 5, 100])
def test_poll_delay__past_the_horizon_is_hourly_whatever_the_rung(polls):
    assert poll_delay(polls, RecoveryPolicy(), past_horizon=True) == 3600.0


def test_poll_delay__follows_a_shrunk_policy():
    policy = RecoveryPolicy(ladder=(0.01, 0.02), past_horizon_every=0.5)
    assert [poll_delay(n, policy) for n in range(4)] == [0.01, 0.02, 0.02, 0.02]
    assert poll_delay(0, policy, past_horizon=True) == 0.5


@pytest.mark.parametrize(
    ("age", "past"),
    [(0.0, False), (-60.0, False), (86399.999, False), (86400.0, True), (86400.001, True), (10 * 86400.0, True)],
)
def test_past_the_horizon(age, past):
    assert past_the_horizon(age, RecoveryPolicy()) is past


def test_the_default_policy_is_the_designs():
    policy = RecoveryPolicy()
    assert policy.not_found_window == 60.0
    assert policy.horizon == 24 * 3600.0
    assert policy.past_horizon_every == 3600.0
    assert policy.ladder == DEFAULT_LADDER and policy.ladder[:2] == (10.0, 20.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"not_found_window": -1},
        {"horizon": 0},
        {"past_horizon_every": 0},
        {"not_found_streak": 0},
        {"ladder": ()},
        {"ladder": (10.0, 0.0)},
        {"wait_margin": -1},
        {"confirm_grace": -0.1},
    ],
)
def test_a_nonsensical_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        RecoveryPolicy(**kwargs)
