"""The settlement's guarded writes: a charge reaching succeeded or failed, with its intent
and (for a success) its checkout session, in as few statements as the guards allow.

Called inside the transaction that also writes the event (``services.transitions``); each
returns what moved, and a write that matches nothing means somebody else settled first.
"""

from __future__ import annotations

from django.db import connection

from charges.models import CheckoutSession
from charges.states import ChargeStatus, CheckoutPaymentStatus, CheckoutSessionStatus, IntentStatus
from vpay.pipelined import fetch_prepared

# Where a charge settles from, and the intents that may follow it.
_SETTLEABLE = sorted({ChargeStatus.SUBMITTED, ChargeStatus.UNRESOLVED})
_OPEN_INTENT = sorted({IntentStatus.PROCESSING, IntentStatus.REQUIRES_ACTION})

# Both compare-and-swaps in one statement (one round trip): the charge's (primary key, from
# one of ``settleable`` to succeeded | failed; a success records what was captured, the whole
# amount unless the rail said less) and, only if it moved, its intent's (primary key, from
# one of ``open_intent`` to the same outcome, with what it received). The intent's write
# reads the charge's RETURNING, so it waits for it: row locks are taken charge first,
# intent second, the order the two separate statements took before. Counts the charges
# moved (0 or 1). Prepared (vpay.pipelined.fetch_prepared, which sends the BEGIN when it is
# its transaction's first statement): planning it each time cost the database more than
# running it (pg_stat_statements over a settlement run, bench/CHARGES.md); its parameters'
# types are written where no column says. charges_pkey, then payment_intents_pkey.
_SETTLE = """
WITH charge AS (
    UPDATE charges
       SET status = %(status)s::text, failure_code = %(failure_code)s::text,
           amount_captured = CASE WHEN %(status)s::text = 'succeeded'
                                  THEN coalesce(%(amount_captured)s::bigint, amount) END,
           updated_at = statement_timestamp()
     WHERE id = %(charge_id)s::text AND status = ANY(%(settleable)s::text[])
    RETURNING intent_id, amount_captured
), intent AS (
    UPDATE payment_intents p
       SET status = %(intent_status)s::text, amount_received = coalesce(charge.amount_captured, 0),
           amount_capturable = 0, updated_at = statement_timestamp()
      FROM charge
     WHERE p.id = charge.intent_id AND p.status = ANY(%(open_intent)s::text[])
)
SELECT count(*) FROM charge
"""


def settle_charge_and_intent(
    charge_id: str,
    status: ChargeStatus,
    intent_status: IntentStatus,
    failure_code: str | None = None,
    *,
    settleable=_SETTLEABLE,
    open_intent=_OPEN_INTENT,
    amount_captured: int | None = None,
) -> bool:
    """``submitted | unresolved`` (or ``settleable``) ``→ succeeded | failed``, and the intent
    with it from ``open_intent``; whether the charge moved."""
    params = {
        "charge_id": charge_id,
        "status": str(status),
        "failure_code": failure_code,
        "intent_status": str(intent_status),
        "settleable": [str(s) for s in settleable],
        "open_intent": [str(s) for s in open_intent],
        "amount_captured": amount_captured,
    }
    return fetch_prepared(_SETTLE, params)[0][0] == 1


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
