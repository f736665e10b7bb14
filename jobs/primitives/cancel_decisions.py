"""The pure cancel table: what an operator's cancel does to one job, from what is locked.

No database, no clock. ``jobs.services.cancels`` reads the job's row under its row lock
(``jobs.primitives.cancels.LOCK_FOR_CANCEL``), asks :func:`decide`, and writes what it says in the same
transaction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class JobPhase(enum.StrEnum):
    """Where the job stands, as its row and its worker's liveness say (database clock)."""

    WAITING = "waiting"  # not leased: due or scheduled
    RUNNING = "running"  # leased by a worker that is alive
    ORPHANED = "orphaned"  # leased, but its lease ran out or its worker has no ``workers`` row


class CancelAction(enum.StrEnum):
    END_NOW = "end_now"  # into dead_letters as cancelled, in this transaction
    REQUEST = "request"  # record who and why on the row: the handler sees it at its next heartbeat
    ALREADY_REQUESTED = "already_requested"  # a request stands: nothing written, the first one's who/why kept
    REFUSE = "refuse"


class Refusal(enum.StrEnum):
    NOT_FOUND = "not_found"
    REASON_REQUIRED = "reason_required"
    NOT_CANCELLABLE = "not_cancellable"


@dataclass(frozen=True, slots=True)
class CancelDecision:
    action: CancelAction
    refusal: Refusal | None = None


def decide(
    *, reason_given: bool, found: bool, cancellable: bool, phase: JobPhase | None, requested: bool
) -> CancelDecision:
    """The cancel of one job. ``phase`` and ``requested`` are read only when ``found``.

    A waiting job ends at once (nothing runs it). So does an orphaned one: its worker will
    never answer, and waiting for the reaper to put it back in the queue would only let it
    start again. A running one gets a request its handler sees at its next heartbeat; the
    first request's who and why stand. A kind that declares itself not cancellable is
    refused in every phase: the refusal quotes its reason (``KindSpec.not_cancellable``).
    """
    if not reason_given:
        return CancelDecision(CancelAction.REFUSE, Refusal.REASON_REQUIRED)
    if not found:
        return CancelDecision(CancelAction.REFUSE, Refusal.NOT_FOUND)
    if not cancellable:
        return CancelDecision(CancelAction.REFUSE, Refusal.NOT_CANCELLABLE)
    if phase is JobPhase.RUNNING:
        return CancelDecision(CancelAction.ALREADY_REQUESTED if requested else CancelAction.REQUEST)
    return CancelDecision(CancelAction.END_NOW)
