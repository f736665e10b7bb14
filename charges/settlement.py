"""``settle``: what a rail's answer does to a charge. Pure; no database, no clock.

The poll handler asks the rail, then asks this table, then performs the one write (or
none) the answer names. Past the horizon every answer short of a terminal one escalates
instead of taking another rung: the horizon decides what happens to a non-answer, never
whether the rail is asked.
"""

from __future__ import annotations

import enum

from charges.states import CHARGE_TERMINAL, ChargeStatus, RailStatus


class Settlement(enum.StrEnum):
    """The one thing to do with an answer."""

    IGNORE = "ignore"  # the charge is already terminal: touch nothing
    SUCCEED = "succeed"  # -> succeeded (intent succeeded, event)
    FAIL = "fail"  # -> failed (intent failed, event)
    MARK_SUBMITTED = "mark_submitted"  # a submitting charge the rail knows: -> submitted, next rung
    STAY = "stay"  # nothing to write; next rung of the ladder
    ESCALATE = "escalate"  # past the horizon: -> unresolved (idempotent), alert, poll hourly


# Answers that say nothing final about the money.
_NON_TERMINAL = frozenset({RailStatus.PENDING, RailStatus.NOT_FOUND, RailStatus.UNAVAILABLE})


def settle(status: ChargeStatus, answer: RailStatus, *, past_horizon: bool) -> Settlement:
    """The settlement table.

    ============  =========================  =========================  ==================
    charge        succeeded / failed answer  pending                    404 / unavailable
    ============  =========================  =========================  ==================
    terminal      IGNORE                     IGNORE                     IGNORE
    submitting    SUCCEED / FAIL             MARK_SUBMITTED | ESCALATE  STAY | ESCALATE
    submitted     SUCCEED / FAIL             STAY | ESCALATE            STAY | ESCALATE
    unresolved    SUCCEED / FAIL             STAY | ESCALATE            STAY | ESCALATE
    ============  =========================  =========================  ==================

    ``|``: before / past the horizon. A 404 about a charge past ``submitting`` is an
    ordinary pending answer: the payer has been handed what they needed, so nothing about
    the charge may be concluded from the rail not knowing it (only the crash-recovery table
    reads 404s, and only for ``submitting``). A late success of an ``unresolved`` charge is
    the normal way it ends.
    """
    status = ChargeStatus(status)
    answer = RailStatus(answer)
    if status in CHARGE_TERMINAL:
        return Settlement.IGNORE
    if answer is RailStatus.SUCCEEDED:
        return Settlement.SUCCEED
    if answer is RailStatus.FAILED:
        return Settlement.FAIL
    assert answer in _NON_TERMINAL
    if past_horizon:
        return Settlement.ESCALATE
    if status is ChargeStatus.SUBMITTING and answer is RailStatus.PENDING:
        # The rail answering about it is the evidence the lost submit landed.
        return Settlement.MARK_SUBMITTED
    return Settlement.STAY
