"""Every refunds statement that needs PostgreSQL, and every compare-and-swap on a refund.

As in ``charges.repository``: instants are PostgreSQL's, ages are measured by the statement
that reads the row, and every status write is guarded on its source states and returns
whether it matched (False: somebody else moved the row first).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import F
from django.db.models.functions import Now

from charges import guarded
from charges.models import PaymentIntent, Refund
from charges.recovery import SubmitEvidence
from charges.states import REFUND_LIVE, RefundStatus
from jobs.kinds import JobKind

POLL_DEDUPE_PREFIX = "refund:poll:"


def poll_dedupe_key(refund_id: str) -> str:
    """The refund's poll job: one live job per refund, which also sends it."""
    return POLL_DEDUPE_PREFIX + refund_id


@dataclass(frozen=True, slots=True)
class RefundRow:
    """A refund as the worker reads it: its columns plus what the database measured."""

    id: str
    merchant_id: str
    intent_id: str
    charge_id: str
    rail: str
    amount: int
    currency: str
    status: RefundStatus
    not_found_count: int
    age: float  # seconds since created_at, on the database clock
    not_found_age: float | None  # seconds since first_not_found_at
    polls: int  # status requests made so far: the rung of the ladder
    submit: SubmitEvidence


# One statement: the row, its ages (now() of this statement), the ladder rung and the submit
# evidence. Both subqueries use provider_requests_refund_op (refund_id, operation).
_READ_FOR_POLL = """
SELECT f.id, f.merchant_id, f.intent_id, f.charge_id, f.rail, f.amount, f.currency, f.status,
       f.not_found_count,
       extract(epoch FROM now() - f.created_at)::float8,
       extract(epoch FROM now() - f.first_not_found_at)::float8,
       (SELECT count(*) FROM provider_requests r WHERE r.refund_id = f.id AND r.operation = 'refund_status'),
       s.id IS NOT NULL, s.rail_status IS NOT NULL
  FROM refunds f
  LEFT JOIN LATERAL (
      SELECT r.id, r.rail_status FROM provider_requests r
       WHERE r.refund_id = f.id AND r.operation = 'refund_submit'
       ORDER BY r.id DESC LIMIT 1
  ) s ON true
 WHERE f.id = %s
"""


def read_for_poll(refund_id: str) -> RefundRow | None:
    with connection.cursor() as cursor:
        cursor.execute(_READ_FOR_POLL, [refund_id])
        r = cursor.fetchone()
    if r is None:
        return None
    if not r[12]:
        submit = SubmitEvidence.NEVER
    elif not r[13]:
        submit = SubmitEvidence.UNANSWERED
    else:
        submit = SubmitEvidence.ANSWERED
    return RefundRow(
        id=r[0],
        merchant_id=r[1],
        intent_id=r[2],
        charge_id=r[3],
        rail=r[4],
        amount=r[5],
        currency=r[6],
        status=RefundStatus(r[7]),
        not_found_count=r[8],
        age=r[9],
        not_found_age=r[10],
        polls=r[11],
        submit=submit,
    )


# --- the intent's refunded amount (under its row lock) ------------------------------------


def repair_amount_received(intent_id: str) -> None:
    """A succeeded intent with nothing received (settled by a worker older than manual capture,
    whose settlement did not write it): it received its whole amount. Under the row lock."""
    PaymentIntent.objects.filter(pk=intent_id, amount_received=0).update(amount_received=F("amount"), updated_at=Now())


def set_amount_refunded(intent_id: str, amount_refunded: int) -> None:
    """Write the new total the caller computed under ``guarded.lock_intent``'s lock."""
    PaymentIntent.objects.filter(pk=intent_id).update(amount_refunded=amount_refunded, updated_at=Now())


def give_back(intent_id: str, amount: int) -> None:
    """A failed refund's amount may be refunded again. One UPDATE: it takes the row lock, so
    it serializes with a create holding it; the CHECK keeps the total within [0, amount]."""
    PaymentIntent.objects.filter(pk=intent_id).update(amount_refunded=F("amount_refunded") - amount, updated_at=Now())


# --- compare-and-swap transitions ---------------------------------------------------------


def _cas(refund_id: str, sources, **changes) -> bool:
    return guarded.cas(Refund, refund_id, sources, **changes)


def mark_pending(refund_id: str) -> bool:
    """``submitting → pending``: the rail answered about it. Clears the 404 evidence."""
    return _cas(
        refund_id,
        [RefundStatus.SUBMITTING],
        status=RefundStatus.PENDING,
        not_found_count=0,
        first_not_found_at=None,
    )


def settle(refund_id: str, status: RefundStatus, failure_code: str | None = None) -> bool:
    """``submitting | pending | unresolved → succeeded | failed``."""
    return _cas(
        refund_id,
        [RefundStatus.SUBMITTING, RefundStatus.PENDING, RefundStatus.UNRESOLVED],
        status=status,
        failure_code=failure_code,
    )


def escalate(refund_id: str) -> bool:
    """``submitting | pending → unresolved``; matches nothing on one already unresolved."""
    return _cas(
        refund_id,
        [RefundStatus.SUBMITTING, RefundStatus.PENDING],
        status=RefundStatus.UNRESOLVED,
        unresolved_at=Now(),
    )


# One more 404 about a submitting refund; the first one's instant is the database's. A
# primary-key update.
_RECORD_NOT_FOUND = """
UPDATE refunds
   SET not_found_count = not_found_count + 1,
       first_not_found_at = coalesce(first_not_found_at, now()),
       updated_at = now()
 WHERE id = %s AND status = 'submitting'
"""


def record_not_found(refund_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_RECORD_NOT_FOUND, [refund_id])


# One more thing a resend must do first: forget the 404 streak that justified it, so a
# resend that goes unanswered is asked about on the next rung, not sent again on each one.
# A primary-key update.
_FORGET_NOT_FOUND = """
UPDATE refunds SET not_found_count = 0, first_not_found_at = NULL, updated_at = now()
 WHERE id = %s AND status IN ('submitting', 'unresolved')
"""


def forget_not_found(refund_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_FORGET_NOT_FOUND, [refund_id])


# --- the backstop (charges.services.backstop_scan.scan_live_charges) ---------------------------


def live_page(after: str, limit: int) -> list[tuple[str, str]]:
    """Live refunds with ids after ``after`` whose poll is not awaiting a human's review
    (refunds_live_idx)."""
    return guarded.live_page(
        "refunds", REFUND_LIVE, prefix=POLL_DEDUPE_PREFIX, kind=JobKind.POLL_REFUND.value, after=after, limit=limit
    )


def restored_live(refund_ids: list[str]) -> int:
    """Of ``refund_ids``, the live refunds whose poll this transaction inserted."""
    return guarded.restored_live(
        "refunds", REFUND_LIVE, prefix=POLL_DEDUPE_PREFIX, kind=JobKind.POLL_REFUND.value, ids=refund_ids
    )
