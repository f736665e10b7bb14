"""The pure cancel table (jobs.primitives.cancel_decisions), every cell."""

from __future__ import annotations

import itertools

import pytest

from jobs.primitives.cancel_decisions import CancelAction, CancelDecision, JobPhase, Refusal, decide


@pytest.mark.parametrize(
    ("reason_given", "found", "cancellable", "phase", "requested"),
    list(itertools.product([False, True], [False, True], [False, True], [None, *JobPhase], [False, True])),
)
def test_cancel_table(reason_given, found, cancellable, phase, requested):
    if not reason_given:
        expected = CancelDecision(CancelAction.REFUSE, Refusal.REASON_REQUIRED)
    elif not found:
        expected = CancelDecision(CancelAction.REFUSE, Refusal.NOT_FOUND)
    elif not cancellable:
        expected = CancelDecision(CancelAction.REFUSE, Refusal.NOT_CANCELLABLE)
    elif phase is JobPhase.RUNNING and requested:
        expected = CancelDecision(CancelAction.ALREADY_REQUESTED)
    elif phase is JobPhase.RUNNING:
        expected = CancelDecision(CancelAction.REQUEST)
    else:  # waiting, or its worker dead: nothing will answer, end it now
        expected = CancelDecision(CancelAction.END_NOW)
    got = decide(reason_given=reason_given, found=found, cancellable=cancellable, phase=phase, requested=requested)
    assert got == expected


def test_a_job_whose_worker_is_dead_is_ended_at_once_even_with_a_request_standing():
    decision = decide(reason_given=True, found=True, cancellable=True, phase=JobPhase.ORPHANED, requested=True)
    assert decision.action is CancelAction.END_NOW
