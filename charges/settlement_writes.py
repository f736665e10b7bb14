"""The settlement's guarded writes: a charge reaching succeeded or failed, with its intent
and (for a success) its checkout session, in as few statements as the guards allow.

Called inside the transaction that also writes the event (``services.transitions``); each
returns what moved (the settlement: the rows its event renders), and a write that matches
nothing means somebody else settled first.
"""

from __future__ import annotations

from django.db import connection

from charges.models import Charge, CheckoutSession, PaymentIntent
from charges.states import ChargeStatus, CheckoutPaymentStatus, CheckoutSessionStatus, IntentStatus
from vpay.pipelined import fetch_prepared
from vpay.rows import columns_of, from_row

# Where a charge settles from, and the intents that may follow it.
_SETTLEABLE = sorted({ChargeStatus.SUBMITTED, ChargeStatus.UNRESOLVED})
_OPEN_INTENT = sorted({IntentStatus.PROCESSING, IntentStatus.REQUIRES_ACTION})

# Both compare-and-swaps in one statement (one round trip): the charge's (primary key, from
# one of ``settleable`` to succeeded | failed; a success records what was captured, the whole
# amount unless the rail said less) and, only if it moved, its intent's (primary key, from
# one of ``open_intent`` to the same outcome, with what it received). The intent's write
# reads the charge's RETURNING, so it waits for it: row locks are taken charge first,
# intent second, the order the two separate statements took before. Its rows are what the
# settlement's event renders, as the rows stand after the writes: the charge's and the
# intent's from their RETURNING (the intent as it is when this statement did not move it: read
# FOR SHARE, so a write committed while the intent's update waited for the row, which made
# that update match nothing, is read as committed, not as of the statement's start), and
# the intent's checkout session, which the statement does not write; none when the charge did
# not move. It used to be read back by a statement of its own (repository.for_event), a round
# trip and a plan more a settled charge. Prepared (vpay.pipelined.fetch_prepared, which sends
# the BEGIN when it is its transaction's first statement): planning it each time cost the
# database more than running it (pg_stat_statements over a settlement run, bench/CHARGES.md);
# its parameters' types are written where no column says. charges_pkey, payment_intents_pkey,
# then the unique index on checkout_sessions.intent_id.
_SETTLE = f"""
WITH charge AS (
    UPDATE charges
       SET status = %(status)s::text, failure_code = %(failure_code)s::text,
           amount_captured = CASE WHEN %(status)s::text = 'succeeded'
                                  THEN coalesce(%(amount_captured)s::bigint, amount) END,
           updated_at = statement_timestamp()
     WHERE id = %(charge_id)s::text AND status = ANY(%(settleable)s::text[])
    RETURNING {columns_of(Charge, "charges")}
), intent AS (
    UPDATE payment_intents p
       SET status = %(intent_status)s::text, amount_received = coalesce(charge.amount_captured, 0),
           amount_capturable = 0, updated_at = statement_timestamp()
      FROM charge
     WHERE p.id = charge.intent_id AND p.status = ANY(%(open_intent)s::text[])
    RETURNING {columns_of(PaymentIntent, "p")}
)
SELECT {columns_of(PaymentIntent, "i")}, {columns_of(Charge, "c")}, {columns_of(CheckoutSession, "s")}
  FROM charge c
  CROSS JOIN LATERAL (
      SELECT * FROM intent
      UNION ALL
      SELECT * FROM (SELECT {columns_of(PaymentIntent, "p")} FROM payment_intents p
                      WHERE p.id = c.intent_id AND NOT EXISTS (SELECT FROM intent) FOR SHARE) stood
  ) i
  LEFT JOIN checkout_sessions s ON s.intent_id = c.intent_id
"""
_INTENT_WIDTH = len(PaymentIntent._meta.concrete_fields)
_CHARGE_WIDTH = len(Charge._meta.concrete_fields)


def settle_charge_and_intent(
    charge_id: str,
    status: ChargeStatus,
    intent_status: IntentStatus,
    failure_code: str | None = None,
    *,
    settleable=_SETTLEABLE,
    open_intent=_OPEN_INTENT,
    amount_captured: int | None = None,
) -> tuple[PaymentIntent, CheckoutSession | None] | None:
    """``submitted | unresolved`` (or ``settleable``) ``→ succeeded | failed``, and the intent
    with it from ``open_intent``. None when the charge did not move; else the intent as it
    stands after the writes, its ``charge`` attached, and its checkout session (if any), as
    ``repository.for_event`` returns them."""
    params = {
        "charge_id": charge_id,
        "status": str(status),
        "failure_code": failure_code,
        "intent_status": str(intent_status),
        "settleable": [str(s) for s in settleable],
        "open_intent": [str(s) for s in open_intent],
        "amount_captured": amount_captured,
    }
    rows = fetch_prepared(_SETTLE, params)
    if not rows:
        return None
    row = rows[0]
    intent = from_row(PaymentIntent, row[:_INTENT_WIDTH])
    intent.charge = from_row(Charge, row[_INTENT_WIDTH : _INTENT_WIDTH + _CHARGE_WIDTH])
    session_row = row[_INTENT_WIDTH + _CHARGE_WIDTH :]
    session = from_row(CheckoutSession, session_row) if session_row[0] is not None else None
    if session is not None:
        intent.checkout_session = session
    return intent, session


# One statement for the session of a paid intent (checkout_sessions' unique index on
# intent_id): marked paid whatever its state (the payment status is the truth about money),
# and open → complete. The old status is read under the row's lock (FOR UPDATE: the latest
# committed version, even one written while this statement waited), so "it moved to
# complete" is decided on the row this statement changes.
_COMPLETE_SESSION = """
WITH was AS (SELECT id, status FROM checkout_sessions WHERE intent_id = %(intent_id)s FOR UPDATE)
UPDATE checkout_sessions s
   SET payment_status = %(paid)s,
       status = CASE WHEN was.status = %(open)s THEN %(complete)s ELSE s.status END,
       completed_at = CASE WHEN was.status = %(open)s THEN statement_timestamp() ELSE s.completed_at END
  FROM was
 WHERE s.id = was.id
RETURNING was.status = %(open)s
"""


def complete_session(intent_id: str, *, paid: bool = True) -> CheckoutSession | None:
    """The intent's session, marked paid, and ``open → complete``; returns it when it moved to
    complete (so its event is emitted), else None. An expired session is marked paid too
    but stays expired. ``paid=False``: an authorization completes the payer's part, and the
    session, but nothing is paid until the capture (which marks it paid)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _COMPLETE_SESSION,
            {
                "intent_id": intent_id,
                "paid": str(CheckoutPaymentStatus.PAID if paid else CheckoutPaymentStatus.UNPAID),
                "open": str(CheckoutSessionStatus.OPEN),
                "complete": str(CheckoutSessionStatus.COMPLETE),
            },
        )
        row = cursor.fetchone()
    moved = bool(row and row[0])
    return CheckoutSession.objects.filter(intent_id=intent_id).first() if moved else None
