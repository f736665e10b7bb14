"""What operators do to dead letters: replay, discard (cancelling a job: ``jobs.services.cancels``).

The admin and ``manage.py deadletters`` both call these; nothing else writes a dead
letter's review state. Each operation on one row is its own transaction: the row is locked,
the decision is taken on what is locked, the write is a compare-and-swap on the state, and
(when a Django user acts) the admin log entry commits with it. A refused operation writes
nothing and says why.

**Replay and the fence horizon.** Replay re-enqueues with the same ``job_id``, so a job
whose effect already happened is skipped by its ``processed_jobs`` row. That row expires
(``VPAY_PROCESSED_JOBS_TTL_SECONDS`` after it was written, and it was written no earlier
than the job's first enqueue). A letter whose job was first enqueued longer ago than the
TTL, less a margin for the replay to be claimed, may have lost its fence row: replaying it
could apply the effect twice (a charge captured twice). Such a replay is refused (unless
the fence row is still there with the margin to spare: then the effect happened and the
replay is a harmless duplicate) unless it is explicitly forced, by someone holding ``jobs.force_replay_deadletter`` in the admin or
with ``--force`` in the shell, after checking the effect did not happen; the letter then
records ``replay_forced``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction

from jobs import registry
from jobs.models import DeadLetter, DeadLetterState
from jobs.operator import dead_letter_sql as operator_sql
from jobs.primitives import fence
from vpay.admin_log import log_change

# Time left on a fence row for a replay to be claimed and see it. An hour covers a queue
# backlog or a worker restart; a replay that waits longer than that is an outage anyway.
REPLAY_FENCE_MARGIN_SECONDS = 3600.0

REASON_MAX = 2000


class Refusal(enum.StrEnum):
    """Why an operation did nothing."""

    NOT_FOUND = "not_found"
    ALREADY_REPLAYED = "already_replayed"
    DISCARDED = "discarded"
    PAST_FENCE_HORIZON = "past_fence_horizon"
    JOB_LIVE = "job_live"
    UNKNOWN_KIND = "unknown_kind"
    REASON_REQUIRED = "reason_required"


_MESSAGES = {
    Refusal.NOT_FOUND: "does not exist",
    Refusal.ALREADY_REPLAYED: "was already replayed",
    Refusal.DISCARDED: "is discarded; a discarded letter is never replayed",
    Refusal.PAST_FENCE_HORIZON: (
        "is older than the processed_jobs fence TTL allows: its fence row may have expired, so a "
        "replay could apply the effect twice. Check the effect did not happen, then replay anyway "
        "(permission jobs.force_replay_deadletter, or --force)"
    ),
    Refusal.JOB_LIVE: "has a live job with the same job_id or dedupe key; let that one finish first",
    Refusal.UNKNOWN_KIND: "is of a kind with no registered handler",
    Refusal.REASON_REQUIRED: "needs a reason (non-blank text)",
}


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one operation on one row."""

    id: int
    done: bool
    refusal: Refusal | None = None
    # Replay: the new job row.
    created_id: int | None = None

    @property
    def message(self) -> str:
        if self.done:
            return "done"
        assert self.refusal is not None  # a result that is not done names its refusal
        return _MESSAGES[self.refusal]


def replay_refusal(status: operator_sql.LetterStatus | None, *, force: bool) -> Refusal | None:
    """Why this dead letter may not be replayed now (None: it may). Pure: the status is read
    by the caller, under a row lock when it is about to act."""
    if status is None:
        return Refusal.NOT_FOUND
    if status.state == DeadLetterState.REPLAYED:
        return Refusal.ALREADY_REPLAYED
    if status.state == DeadLetterState.DISCARDED:
        return Refusal.DISCARDED
    if registry.get(status.kind) is None:
        return Refusal.UNKNOWN_KIND
    if status.job_live or status.key_live:
        return Refusal.JOB_LIVE
    if status.past_horizon and not force:
        return Refusal.PAST_FENCE_HORIZON
    return None


def _statuses(ids: Iterable[int], *, lock: bool) -> dict[int, operator_sql.LetterStatus]:
    found = operator_sql.letter_status(
        list(ids), ttl_seconds=fence.ttl_seconds(), margin_seconds=REPLAY_FENCE_MARGIN_SECONDS, lock=lock
    )
    return {s.id: s for s in found}


def replay_preview(ids: Iterable[int], *, force: bool = False) -> dict[int, Refusal | None]:
    """For a confirmation page or a dry run: each id and why it would be refused (None: replayable)."""
    ids = list(ids)
    statuses = _statuses(ids, lock=False)
    return {i: replay_refusal(statuses.get(i), force=force) for i in ids}


def dead_letter_replay(*, letter_id: int, actor: str, force: bool = False, user_id: int | None = None) -> Result:
    """Re-enqueue the dead letter with its own ``job_id``; ``pending_review → replayed``.

    One transaction: row lock, decision, the job insert and the state swap (one statement),
    and the admin log entry when ``user_id`` is given. ``force`` replays past the fence
    horizon (the caller checked the permission).
    """
    with transaction.atomic():
        status = _statuses([letter_id], lock=True).get(letter_id)
        refusal = replay_refusal(status, force=force)
        if refusal is not None:
            return Result(letter_id, False, refusal)
        assert status is not None  # replay_refusal() refuses a letter that was not found
        forced = force and status.past_horizon
        job_pk = operator_sql.replay_dead_letter(letter_id, actor=_actor(actor), forced=forced)
        if job_pk is None:  # a job took the job_id or dedupe key between the read and the insert
            return Result(letter_id, False, Refusal.JOB_LIVE)
        if user_id is not None:
            message = f"Replayed as job {job_pk}" + (" (forced past the fence horizon)" if forced else "")
            log_change(user_id, DeadLetter, letter_id, f"dead letter {letter_id}", message)
    return Result(letter_id, True, created_id=job_pk)


def dead_letter_discard(*, letter_id: int, actor: str, reason: str, user_id: int | None = None) -> Result:
    """``pending_review → discarded`` with who, when and the (trimmed, non-blank) reason."""
    reason = clean_reason(reason)
    if not reason:
        return Result(letter_id, False, Refusal.REASON_REQUIRED)
    with transaction.atomic():
        if not operator_sql.discard_dead_letter(letter_id, actor=_actor(actor), reason=reason):
            return Result(letter_id, False, _not_pending(letter_id))
        if user_id is not None:
            log_change(user_id, DeadLetter, letter_id, f"dead letter {letter_id}", f"Discarded: {reason}")
    return Result(letter_id, True)


def clean_reason(reason: str | None) -> str:
    """The reason as stored: trimmed, bounded."""
    return (reason or "").strip()[:REASON_MAX]


# Why a discard of a letter in this state does nothing (a missing state: no such letter).
# Keyed by the state as read from the row (a str, or None for no row).
_DISCARD_REFUSAL: dict[str | None, Refusal | None] = {
    DeadLetterState.PENDING_REVIEW: None,
    DeadLetterState.REPLAYED: Refusal.ALREADY_REPLAYED,
    DeadLetterState.DISCARDED: Refusal.DISCARDED,
}


def discard_preview(ids: Iterable[int]) -> dict[int, Refusal | None]:
    """For a dry run: each id and why its discard would be refused (None: discardable)."""
    ids = list(ids)
    states = dict(DeadLetter.objects.filter(pk__in=ids).values_list("pk", "state"))
    return {i: _DISCARD_REFUSAL.get(states.get(i), Refusal.NOT_FOUND) for i in ids}


def _not_pending(letter_id: int) -> Refusal:
    return discard_preview([letter_id])[letter_id] or Refusal.NOT_FOUND


def _actor(actor: str) -> str:
    actor = (actor or "").strip()
    if not actor:
        raise ValueError("an operation needs an actor (who did it)")
    return actor[:150]
