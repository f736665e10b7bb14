"""The capture phase's pure tables (charges.capture_table), cell by cell: when a capture or a
void is sent, and what each answer does to a charge capturing or voiding."""

from __future__ import annotations

import itertools

import pytest

from charges.capture_table import CaptureSettlement as C
from charges.capture_table import CaptureStep, capture_step, settle_capture
from charges.recovery import SubmitEvidence
from charges.states import ChargeStatus as S
from charges.states import RailStatus as R


def test_an_operation_is_sent_only_when_none_went_out_since_it_was_asked_for():
    assert capture_step(SubmitEvidence.NEVER) is CaptureStep.SEND
    assert capture_step(SubmitEvidence.UNANSWERED) is CaptureStep.ASK
    assert capture_step(SubmitEvidence.ANSWERED) is CaptureStep.ASK


# (status, answer) -> what it does, whatever the send's age or the horizon (final answers).
FINAL = {
    (S.CAPTURING, R.SUCCEEDED): C.CAPTURED,
    (S.CAPTURING, R.CANCELED): C.LAPSED,
    (S.CAPTURING, R.FAILED): C.LAPSED,
    (S.VOIDING, R.SUCCEEDED): C.LATE_SUCCESS,
    (S.VOIDING, R.CANCELED): C.VOIDED,
    (S.VOIDING, R.FAILED): C.VOIDED,
    (S.VOIDING, R.NOT_FOUND): C.VOIDED,  # the rail holds nothing under the reference
}


def expected(status, answer, stale, past, refused) -> C:
    if (status, answer) in FINAL:
        return FINAL[(status, answer)]  # a refusal is read through the status, never alone
    if answer is R.AUTHORIZED and refused:
        return C.REFUSED  # the hold stands and the operation did not happen
    if answer is R.AUTHORIZED and stale:
        return C.SEND_AGAIN  # untouched a window after the last send: it never landed
    return C.ESCALATE if past else C.STAY


CELLS = list(itertools.product((S.CAPTURING, S.VOIDING), R, (False, True), (False, True), (False, True)))


@pytest.mark.parametrize(("status", "answer", "stale", "past", "refused"), CELLS)
def test_settle_capture__each_cell(status, answer, stale, past, refused):
    got = settle_capture(status, answer, send_is_stale=stale, past_horizon=past, refused=refused)
    assert got is expected(status, answer, stale, past, refused)


def test_every_outcome_is_reachable():
    assert {expected(*cell) for cell in CELLS} == set(C)


def test_a_capture_answered_404_is_no_answer_and_an_authorization_not_yet_stale_waits():
    # A capture's 404 concludes nothing (a status read of a redirect charge without its
    # token); the authorization may still be captured.
    assert settle_capture(S.CAPTURING, R.NOT_FOUND, send_is_stale=True, past_horizon=False) is C.STAY
    assert settle_capture(S.CAPTURING, R.AUTHORIZED, send_is_stale=False, past_horizon=False) is C.STAY


@pytest.mark.parametrize("status", [s for s in S if s not in (S.CAPTURING, S.VOIDING)])
def test_only_the_capture_phase_is_this_tables(status):
    with pytest.raises(ValueError):
        settle_capture(status, R.SUCCEEDED, send_is_stale=False, past_horizon=False)
