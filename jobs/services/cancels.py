"""Cancelling a job, waiting or running: the one writer of cancel requests.

The admin's *Cancel* action, ``manage.py jobs cancel`` and Python callers all come here.
One transaction per job: its row is locked and its phase read (``jobs.primitives.cancels``), the pure
table (``jobs.primitives.cancel_decisions``) decides, and the write (and, when a Django user acts,
the admin log entry) commits with it. A refusal writes nothing and raises
:class:`CancelRefused`, whose message says why.

End states (docs/runner.md, "Cancel"):

* waiting, or its worker dead: a dead letter at once, cause ``cancelled``, closed as
  discarded by the actor with the reason (``Cancelled.dead_letter_id``);
* running: a request on the row; the handler's next ``heartbeat()`` raises
  ``JobCancelled`` and the job ends the same way, with the requester's who and why. A
  handler that finishes first keeps its answer (the request is overtaken).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction

from jobs import registry
from jobs.models import DeadLetter, Job
from jobs.primitives import cancels
from jobs.primitives.cancel_decisions import CancelAction, JobPhase, Refusal, decide
from jobs.services.dead_letters import clean_reason
from vpay.admin_log import log_change

_MESSAGES = {
    Refusal.NOT_FOUND: "is not a live job (unknown id, or it already finished or was dead-lettered)",
    Refusal.REASON_REQUIRED: "needs a reason (non-blank text)",
    Refusal.NOT_CANCELLABLE: "is of kind {kind!r}, which cannot be cancelled: {why}",
}


class CancelRefused(Exception):
    """The cancel did nothing; ``str()`` says why, ``refusal`` is the machine-readable cause."""

    def __init__(self, job: str, refusal: Refusal, *, kind: str = "", why: str = "") -> None:
        self.job, self.refusal = job, refusal
        super().__init__(f"job {job} " + _MESSAGES[refusal].format(kind=kind, why=why))


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did: ended the job (``dead_letter_id``), or asked its handler to stop."""

    job_pk: int
    phase: JobPhase
    dead_letter_id: int | None = None
    # A request already stood (``requested_by`` asked first): nothing was written.
    already_requested: bool = False
    requested_by: str = ""

    @property
    def ended(self) -> bool:
        return self.dead_letter_id is not None

    @property
    def message(self) -> str:
        if self.ended:
            dead = " (its worker was dead)" if self.phase is JobPhase.ORPHANED else ""
            return f"cancelled{dead}: dead letter #{self.dead_letter_id}"
        if self.already_requested:
            return f"running; a cancel was already requested by {self.requested_by}"
        return "running; cancel requested: its handler stops at its next heartbeat"


def job_cancel(
    *,
    actor: str,
    reason: str,
    job_id: uuid.UUID | str | None = None,
    job_pk: int | None = None,
    user_id: int | None = None,
) -> Cancelled:
    """Cancel one live job, named by its ``job_id`` (the Tasks result id) or its row id.

    Raises :class:`CancelRefused` (unknown job, blank reason, a kind that is not
    cancellable) and ``ValueError`` for a malformed id or a missing actor.
    """
    if (job_id is None) == (job_pk is None):
        raise ValueError("name the job by exactly one of job_id and job_pk")
    if job_id is not None and not isinstance(job_id, uuid.UUID):
        try:
            job_id = uuid.UUID(str(job_id))
        except ValueError:
            raise ValueError(f"{job_id!r} is not a job id (a UUID)") from None
    label = str(job_id if job_id is not None else job_pk)
    actor, reason = _actor(actor), clean_reason(reason)
    with transaction.atomic():
        locked = cancels.lock_for_cancel(job_id=job_id, job_pk=job_pk) if reason else None
        spec = registry.get(locked.kind) if locked else None
        decision = decide(
            reason_given=bool(reason),
            found=locked is not None,
            # A kind with no handler here is poison anyway: nothing speaks against cancelling it.
            cancellable=spec is None or spec.cancellable,
            phase=locked.phase if locked else None,
            requested=locked.requested if locked else False,
        )
        if decision.action is CancelAction.REFUSE:
            assert decision.refusal is not None  # a refusal is named
            raise CancelRefused(label, decision.refusal, kind=locked.kind if locked else "", why=_why(spec))
        assert locked is not None  # decide() refuses a job that was not found
        if decision.action is CancelAction.ALREADY_REQUESTED:
            return Cancelled(locked.id, locked.phase, already_requested=True, requested_by=locked.requested_by)
        if decision.action is CancelAction.REQUEST:
            cancels.request(locked.id, actor=actor, reason=reason)
            if user_id is not None:
                log_change(user_id, Job, locked.id, f"job {locked.id}", f"Cancel requested while running: {reason}")
            return Cancelled(locked.id, locked.phase)
        letter_id = cancels.end_now(locked.id, actor=actor, reason=reason)
        if user_id is not None:
            log_change(user_id, Job, locked.id, f"job {locked.id}", f"Cancelled into dead letter {letter_id}: {reason}")
            log_change(
                user_id, DeadLetter, letter_id, f"dead letter {letter_id}", f"Created by cancelling job {locked.id}"
            )
    return Cancelled(locked.id, locked.phase, dead_letter_id=letter_id)


def _why(spec: registry.KindSpec | None) -> str:
    return spec.not_cancellable if spec is not None and spec.not_cancellable else ""


def _actor(actor: str) -> str:
    actor = (actor or "").strip()
    if not actor:
        raise ValueError("a cancel needs an actor (who asked)")
    return actor[:150]
