"""Every charges statement that needs PostgreSQL, and every compare-and-swap on a status.

Instants are PostgreSQL's (``now()``); ages are computed on the statement that reads the
row, so no decision compares this host's clock with a time the database wrote. Every
status write is guarded on its source states and returns whether it matched: a guarded
write that matches nothing means somebody else moved the row first, and the caller must
not act as if it had. The rail requests' own statements are ``charges.request_log``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connection
from django.db.models.functions import Now

from charges import guarded
from charges.models import (
    Charge,
    CheckoutSession,
    PaymentIntent,
)
from charges.recovery import Evidence, SubmitEvidence
from charges.states import (
    CHARGE_LIVE,
    ChargeStatus,
    IntentStatus,
    RailFlow,
)
from jobs.kinds import JobKind
from vpay import sealing
from vpay.pipelined import fetch_prepared
from vpay.rows import columns_of, from_row

POLL_DEDUPE_PREFIX = "charge:poll:"  # also matched in SQL by the backstop (_LIVE_PAGE)


def poll_dedupe_key(charge_id: str) -> str:
    """The poll job's dedupe key: one live poll per charge."""
    return POLL_DEDUPE_PREFIX + charge_id


def resubmit_dedupe_key(charge_id: str) -> str:
    return f"charge:resubmit:{charge_id}"


# --- reading a charge for the worker ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChargeRow:
    """A charge as the worker reads it: its columns plus what the database measured."""

    id: str
    merchant_id: str
    intent_id: str
    rail: str
    flow: RailFlow
    amount: int
    currency: str
    status: ChargeStatus
    manual_capture: bool
    pay_token: str | None = field(repr=False)
    not_found_count: int
    age: float  # seconds since created_at, on the database clock
    not_found_age: float | None  # seconds since first_not_found_at
    polls: int  # status requests made so far: the rung of the poll ladder
    submit_sent: bool  # a submit request row exists
    submit_answered: bool  # the latest submit got a usable answer (a rail status was recorded)

    def evidence(self) -> Evidence:
        """The crash-recovery table's input."""
        if not self.submit_sent:
            submit = SubmitEvidence.NEVER
        elif not self.submit_answered:  # no answer, or none to act on (5xx, 409, 429, unreadable)
            submit = SubmitEvidence.UNANSWERED
        else:
            submit = SubmitEvidence.ANSWERED
        return Evidence(self.age, self.flow, submit, self.not_found_count, self.not_found_age)


# One statement: the row, its ages (now() of this very statement), the ladder rung and the
# submit evidence. Ages are taken here and only here.
_READ_FOR_POLL = """
SELECT c.id, c.merchant_id, c.intent_id, c.rail, c.flow, c.amount, c.currency, c.status, c.pay_token,
       c.not_found_count, c.manual_capture,
       extract(epoch FROM now() - c.created_at)::float8,
       extract(epoch FROM now() - c.first_not_found_at)::float8,
       (SELECT count(*) FROM provider_requests r WHERE r.charge_id = c.id AND r.operation = 'status'),
       s.id IS NOT NULL, s.rail_status IS NOT NULL
  FROM charges c
  LEFT JOIN LATERAL (
      SELECT r.id, r.rail_status FROM provider_requests r
       WHERE r.charge_id = c.id AND r.operation = 'submit'
       ORDER BY r.id DESC LIMIT 1
  ) s ON true
 WHERE c.id = %(id)s
"""


# The same, for the charges a poll carries (charges.services.poll_batch): by primary key.
_READ_MANY_FOR_POLL = _READ_FOR_POLL.replace("WHERE c.id = %(id)s", "WHERE c.id = ANY(%(ids)s::text[])")


def read_for_poll(charge_id: str) -> ChargeRow | None:
    rows = fetch_prepared(_READ_FOR_POLL, {"id": charge_id})
    return _poll_row(rows[0]) if rows else None


def read_many_for_poll(charge_ids: list[str]) -> dict[str, ChargeRow]:
    # Generic: by primary key in an array, planned again at almost every call otherwise.
    return {r[0]: _poll_row(r) for r in fetch_prepared(_READ_MANY_FOR_POLL, {"ids": charge_ids}, generic=True)}


def _poll_row(r: tuple) -> ChargeRow:
    return ChargeRow(
        id=r[0],
        merchant_id=r[1],
        intent_id=r[2],
        rail=r[3],
        flow=RailFlow(r[4]),
        amount=r[5],
        currency=r[6],
        status=ChargeStatus(r[7]),
        pay_token=sealing.open_text(r[8], sealing.binding_of(Charge, "pay_token", r[0])),  # sealed for its row
        not_found_count=r[9],
        manual_capture=r[10],
        age=r[11],
        not_found_age=r[12],
        polls=r[13],
        submit_sent=r[14],
        submit_answered=r[15],
    )


# The merchant's intent, its row locked until the confirm's first transaction ends
# (payment_intents_pkey).
_LOCK_FOR_CONFIRM = f"""
SELECT {columns_of(PaymentIntent, "p")} FROM payment_intents p
 WHERE p.id = %(id)s AND p.merchant_id = %(merchant_id)s FOR UPDATE
"""

# Whether the intent's checkout session is dead: expired, or past its expires_at on the
# database clock (checkout_sessions' unique index on intent_id). A statement of its own,
# after the lock's: under READ COMMITTED a statement's snapshot and instant are taken when
# it starts, so read in the locking statement they would predate the wait for the lock.
_SESSION_DEAD = """
SELECT EXISTS (SELECT 1 FROM checkout_sessions s
                WHERE s.intent_id = %(intent_id)s AND (s.status = 'expired' OR s.expires_at <= statement_timestamp()))
"""


def lock_for_confirm(merchant_id: str, intent_id: str) -> tuple[PaymentIntent | None, bool]:
    """The merchant's intent, locked, and whether its checkout session is dead. Two plain
    statements where the ORM compiled two querysets, a quarter of the confirm's CPU."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_for_confirm() holds a row lock: it must run inside a transaction")
    rows = fetch_prepared(_LOCK_FOR_CONFIRM, {"id": intent_id, "merchant_id": merchant_id})
    if not rows:
        return None, False
    ((dead,),) = fetch_prepared(_SESSION_DEAD, {"intent_id": intent_id})
    return from_row(PaymentIntent, rows[0]), dead


# The intent as an event reports it, after the writes, with its charge and its checkout
# session (both one-to-one; a session is created with its intent or never): one statement by
# payment_intents_pkey and the unique indexes on charges.intent_id and
# checkout_sessions.intent_id. It replaced a joined queryset whose compile was a fifth of the
# worker's CPU on the settlement path (bench/CHARGES.md, "The web process"). Prepared
# (vpay.pipelined): the server took five times longer to plan the join than to run it.
_FOR_EVENT = f"""
SELECT {columns_of(PaymentIntent, "p")}, {columns_of(Charge, "c")}, {columns_of(CheckoutSession, "s")}
  FROM payment_intents p
  LEFT JOIN charges c ON c.intent_id = p.id
  LEFT JOIN checkout_sessions s ON s.intent_id = p.id
 WHERE p.id = %(intent_id)s::text
"""
_INTENT_WIDTH = len(PaymentIntent._meta.concrete_fields)
_CHARGE_WIDTH = len(Charge._meta.concrete_fields)


def for_event(intent_id: str) -> tuple[PaymentIntent, CheckoutSession | None]:
    """The intent (its ``charge`` attached) and its checkout session, if it has one. Every
    caller reads an intent that has a charge; one without would read it lazily."""
    rows = fetch_prepared(_FOR_EVENT, {"intent_id": intent_id})
    if not rows:
        raise PaymentIntent.DoesNotExist(intent_id)
    row = rows[0]
    intent = from_row(PaymentIntent, row[:_INTENT_WIDTH])
    charge_row, session_row = row[_INTENT_WIDTH : _INTENT_WIDTH + _CHARGE_WIDTH], row[_INTENT_WIDTH + _CHARGE_WIDTH :]
    if charge_row[0] is not None:
        intent.charge = from_row(Charge, charge_row)
    session = from_row(CheckoutSession, session_row) if session_row[0] is not None else None
    if session is not None:
        intent.checkout_session = session
    return intent, session


def charge_status(charge_id: str) -> str | None:
    return Charge.objects.filter(id=charge_id).values_list("status", flat=True).first()


# --- compare-and-swap transitions -----------------------------------------------------------


_cas = guarded.cas


def mark_submitted(charge_id: str, *, pay_token: str | None, redirect_url: str | None) -> bool:
    """``submitting → submitted``, storing what the flow needs; clears the 404 evidence
    (it described a charge the rail did not have, and now it does)."""
    changes = {"status": ChargeStatus.SUBMITTED, "not_found_count": 0, "first_not_found_at": None}
    if pay_token:
        changes["pay_token"] = sealing.seal_for(Charge, "pay_token", charge_id, pay_token)
    if redirect_url:
        changes["redirect_url"] = sealing.seal_for(Charge, "redirect_url", charge_id, redirect_url)
    return _cas(Charge, charge_id, [ChargeStatus.SUBMITTING], **changes)


def fail_submitting(charge_id: str, failure_code: str) -> bool:
    """``submitting → failed``: a dead redirect order, or a submit the rail refused for good."""
    return _cas(Charge, charge_id, [ChargeStatus.SUBMITTING], status=ChargeStatus.FAILED, failure_code=failure_code)


def escalate_charge(charge_id: str) -> bool:
    """``submitting | submitted → unresolved``. Matches nothing on an ``unresolved`` charge:
    that is what makes the hourly re-escalation write nothing."""
    return _cas(
        Charge,
        charge_id,
        [ChargeStatus.SUBMITTING, ChargeStatus.SUBMITTED],
        status=ChargeStatus.UNRESOLVED,
        unresolved_at=Now(),
    )


_RECORD_NOT_FOUND = """
UPDATE charges
   SET not_found_count = not_found_count + 1,
       first_not_found_at = coalesce(first_not_found_at, now()),
       updated_at = now()
 WHERE id = %s AND status = 'submitting'
"""


def record_not_found(charge_id: str) -> None:
    """One more 404 about a ``submitting`` charge; the first one's instant is the database's."""
    with connection.cursor() as cursor:
        cursor.execute(_RECORD_NOT_FOUND, [charge_id])


# The 404 streak that sent a resubmit, forgotten once the rail refused the resubmit: the
# next poll asks the rail about the charge (it may hold it) instead of resending on every
# rung, and only a new streak spanning the window resubmits again. A primary-key update.
_FORGET_NOT_FOUND = """
UPDATE charges SET not_found_count = 0, first_not_found_at = NULL, updated_at = now()
 WHERE id = %s AND status = 'submitting'
"""


def forget_not_found(charge_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_FORGET_NOT_FOUND, [charge_id])


def intent_to(intent_id: str, status: IntentStatus, sources, **changes) -> bool:
    return _cas(PaymentIntent, intent_id, sources, status=status, **changes)


def authorize_charge(charge_id: str) -> bool:
    """``submitted | unresolved → authorized``; its expiry counts from ``authorized_at``."""
    return _cas(
        Charge,
        charge_id,
        [ChargeStatus.SUBMITTED, ChargeStatus.UNRESOLVED],
        status=ChargeStatus.AUTHORIZED,
        authorized_at=Now(),
    )


def cancel_intent(intent_id: str, reason: str | None) -> bool:
    """``requires_confirmation → canceled``: the same guard a confirm's first write has, so a
    cancel and a confirm racing for one intent cannot both move it."""
    return _cas(
        PaymentIntent,
        intent_id,
        [IntentStatus.REQUIRES_CONFIRMATION],
        status=IntentStatus.CANCELED,
        cancellation_reason=reason,
        canceled_at=Now(),
    )


def touch_customer(customer_id: str | None) -> bool:
    """``last_used_at = now()`` on the database clock (what the retention sweep reads);
    ``False`` when there is no such customer. Holds the row's lock until the transaction ends."""
    if not customer_id:
        return False
    with connection.cursor() as cursor:
        # By primary key (customers_pkey).
        cursor.execute("UPDATE customers SET last_used_at = now() WHERE id = %s", [customer_id])
        return cursor.rowcount == 1


# --- the backstop ---------------------------------------------------------------------------


# Keyset pagination by id over charges_live_idx: bounded pages, and a charge created during
# the pass is either on a later page or picked up by the next pass.
def live_page(after: str, limit: int) -> list[tuple[str, str]]:
    """Live charges with ids after ``after`` whose poll is not awaiting a human's review."""
    return guarded.live_page(
        "charges", CHARGE_LIVE, prefix=POLL_DEDUPE_PREFIX, kind=JobKind.POLL_CHARGE.value, after=after, limit=limit
    )


def restored_live(charge_ids: list[str]) -> int:
    """Of ``charge_ids``, the live charges whose poll this transaction inserted."""
    return guarded.restored_live(
        "charges", CHARGE_LIVE, prefix=POLL_DEDUPE_PREFIX, kind=JobKind.POLL_CHARGE.value, ids=charge_ids
    )
