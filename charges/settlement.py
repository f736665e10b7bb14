"""``settle``: what a rail's answer does to a charge. Pure; no database, no clock.

The poll handler asks the rail, then asks this table, then performs the one write (or
none) the answer names. Past the horizon every answer short of a terminal one escalates
instead of taking another rung: the horizon decides what happens to a non-answer, never
whether the rail is asked.
"""

from __future__ import annotations

import enum

from charges.states import CHARGE_LIVE, CHARGE_TERMINAL, ChargeStatus, RailStatus


class Settlement(enum.StrEnum):
    """The one thing to do with an answer."""

    IGNORE = "ignore"  # the charge is already terminal: touch nothing
    SUCCEED = "succeed"  # -> succeeded (intent succeeded, event)
    FAIL = "fail"  # -> failed (intent failed, event)
    AUTHORIZE = "authorize"  # manual capture: -> authorized (intent requires_capture, event); no more polls
    MARK_SUBMITTED = "mark_submitted"  # a submitting charge the rail knows: -> submitted, next rung
    STAY = "stay"  # nothing to write; next rung of the ladder
    ESCALATE = "escalate"  # past the horizon: -> unresolved (idempotent), alert, poll hourly


# The charges this table settles: live, before any authorization.
_SETTLED_HERE = CHARGE_LIVE - {ChargeStatus.AUTHORIZED, ChargeStatus.CAPTURING, ChargeStatus.VOIDING}
# Answers that say nothing final about the money.
_NON_TERMINAL = frozenset({RailStatus.PENDING, RailStatus.NOT_FOUND, RailStatus.UNAVAILABLE})


def settle(status: ChargeStatus, answer: RailStatus, *, past_horizon: bool) -> Settlement:
    """The settlement table.

    ============  ================================  =========================  ==================
    charge        succeeded / failed / authorized   pending                    404 / unavailable
    ============  ================================  =========================  ==================
    terminal      IGNORE                            IGNORE                     IGNORE
    submitting    SUCCEED / FAIL / AUTHORIZE        MARK_SUBMITTED | ESCALATE  STAY | ESCALATE
    submitted     SUCCEED / FAIL / AUTHORIZE        STAY | ESCALATE            STAY | ESCALATE
    unresolved    SUCCEED / FAIL / AUTHORIZE        STAY | ESCALATE            STAY | ESCALATE
    ============  ================================  =========================  ==================

    ``canceled`` (the rail dropped the charge before anyone captured it) is read as
    ``failed``. Terminal includes ``voided``; an ``authorized`` charge, and one ``capturing``
    or ``voiding``, is not this table's (``charges.capture_table``): IGNORE here. Whether an
    ``authorized`` answer is believed of a charge submitted for automatic capture is the
    poll's question (it is not: a non-answer).

    ``|``: before / past the horizon. A 404 about a charge past ``submitting`` is an
    ordinary pending answer: the payer has been handed what they needed, so nothing about
    the charge may be concluded from the rail not knowing it (only the crash-recovery table
    reads 404s, and only for ``submitting``). A late success of an ``unresolved`` charge is
    the normal way it ends.
    """
    status = ChargeStatus(status)
    answer = RailStatus(answer)
    if status in CHARGE_TERMINAL or status not in _SETTLED_HERE:
        return Settlement.IGNORE
    if answer is RailStatus.SUCCEEDED:
        return Settlement.SUCCEED
    if answer in (RailStatus.FAILED, RailStatus.CANCELED):
        return Settlement.FAIL
    if answer is RailStatus.AUTHORIZED:
        return Settlement.AUTHORIZE
    assert answer in _NON_TERMINAL
    if past_horizon:
        return Settlement.ESCALATE
    if status is ChargeStatus.SUBMITTING and answer is RailStatus.PENDING:
        # The rail answering about it is the evidence the lost submit landed.
        return Settlement.MARK_SUBMITTED
    return Settlement.STAY
