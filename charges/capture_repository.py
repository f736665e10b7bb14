"""The statements of a charge's capture phase (manual capture): what the worker reads about a
charge ``capturing`` or ``voiding``, and the guarded writes that start and end each
operation. As in ``charges.repository``: instants are PostgreSQL's, ages are measured by
the statement that reads the row, every status write is a compare-and-swap."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models.functions import Now

from charges.guarded import cas
from charges.models import Charge, PaymentIntent
from charges.recovery import SubmitEvidence
from charges.states import CancellationReason, ChargeStatus, IntentStatus

# 4xx answers that refuse nothing for good (charges.rails.adapter's transient ones, and
# 401/403: our credentials, not the operation).
_NOT_REFUSALS = frozenset({401, 403, 408, 409, 425, 429})


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """A charge in its capture phase as the worker reads it."""

    status: ChargeStatus  # capturing or voiding (anything else: the phase is over)
    amount_to_capture: int | None
    age: float  # seconds since the capture (void) was asked for: the operation's horizon
    polls: int  # status reads since then: the rung of the ladder
    sent: SubmitEvidence  # the operation's latest request since then
    last_send_age: float | None  # seconds since that request went out
    sends: int  # the operation's requests since then
    last_status_code: int | None  # the HTTP status that latest request was answered with
    earlier_phases: int  # the operation's requests before it was asked for (a capture refused before)

    @property
    def refused(self) -> bool:
        """The rail refused the operation's first send for good (a 4xx). A refused *resend*
        proves nothing (the first may have landed): only a lone send's refusal counts."""
        code = self.last_status_code
        return self.sends == 1 and code is not None and 400 <= code < 500 and code not in _NOT_REFUSALS


# One statement: the charge, the age of its operation, the status reads since it began (the
# rung), the operation's latest request since it began (capture or void), how many went out
# since and before. Counted from the operation's start, so a capture refused earlier and
# asked for again is sent again, under a key of its own. Every subquery uses
# provider_requests_charge_op (charge_id, operation, -id).
_READ_PHASE = """
SELECT c.status, c.amount_to_capture,
       extract(epoch FROM now() - p.began)::float8,
       (SELECT count(*) FROM provider_requests r
         WHERE r.charge_id = c.id AND r.operation = 'status' AND r.sent_at >= p.began),
       s.id IS NOT NULL, s.rail_status IS NOT NULL,
       extract(epoch FROM now() - s.sent_at)::float8,
       (SELECT count(*) FROM provider_requests r
         WHERE r.charge_id = c.id AND r.operation = p.operation AND r.sent_at >= p.began),
       s.status_code,
       (SELECT count(*) FROM provider_requests r
         WHERE r.charge_id = c.id AND r.operation = p.operation AND r.sent_at < p.began)
  FROM charges c
 CROSS JOIN LATERAL (
      SELECT CASE c.status WHEN 'capturing' THEN c.capture_requested_at ELSE c.void_requested_at END AS began,
             CASE c.status WHEN 'capturing' THEN 'capture' ELSE 'void' END AS operation
 ) p
  LEFT JOIN LATERAL (
      SELECT r.id, r.rail_status, r.sent_at, r.status_code FROM provider_requests r
       WHERE r.charge_id = c.id AND r.operation = p.operation AND r.sent_at >= p.began
       ORDER BY r.id DESC LIMIT 1
  ) s ON true
 WHERE c.id = %s AND c.status IN ('capturing', 'voiding')
"""


def read_phase(charge_id: str) -> PhaseRow | None:
    """The charge's capture phase, or None when it is not capturing or voiding (any more)."""
    with connection.cursor() as cursor:
        cursor.execute(_READ_PHASE, [charge_id])
        r = cursor.fetchone()
    if r is None:
        return None
    if not r[4]:
        sent = SubmitEvidence.NEVER
    elif not r[5]:
        sent = SubmitEvidence.UNANSWERED
    else:
        sent = SubmitEvidence.ANSWERED
    return PhaseRow(ChargeStatus(r[0]), r[1], max(r[2] or 0.0, 0.0), r[3], sent, r[6], r[7], r[8], r[9])


# --- starting an operation (web process, under the intent's row lock) ---------------------


def start_capture(charge_id: str, amount: int) -> bool:
    """``authorized → capturing``, asking for ``amount``."""
    return cas(
        Charge,
        charge_id,
        [ChargeStatus.AUTHORIZED],
        status=ChargeStatus.CAPTURING,
        amount_to_capture=amount,
        capture_requested_at=Now(),
        failure_code=None,
    )


def start_void(charge_id: str) -> bool:
    """``authorized → voiding``."""
    return cas(Charge, charge_id, [ChargeStatus.AUTHORIZED], status=ChargeStatus.VOIDING, void_requested_at=Now())


def cancel_authorized_intent(intent_id: str, reason: str | None) -> bool:
    """``requires_capture → canceled``: nothing held is capturable any more."""
    return cas(
        PaymentIntent,
        intent_id,
        [IntentStatus.REQUIRES_CAPTURE],
        status=IntentStatus.CANCELED,
        cancellation_reason=reason,
        canceled_at=Now(),
        amount_capturable=0,
    )


# --- ending an operation (worker) ----------------------------------------------------------


def capture_refused(charge_id: str) -> bool:
    """``capturing → authorized``: the rail refused the capture for good; the hold stands."""
    return cas(
        Charge, charge_id, [ChargeStatus.CAPTURING], status=ChargeStatus.AUTHORIZED, failure_code="capture_refused"
    )


def reopen_intent_for_capture(intent_id: str) -> bool:
    """``processing → requires_capture`` (after a refused capture)."""
    return cas(PaymentIntent, intent_id, [IntentStatus.PROCESSING], status=IntentStatus.REQUIRES_CAPTURE)


def end_voided(charge_id: str, sources, failure_code: str | None = None) -> bool:
    """``sources → voided``: the rail holds nothing (any more)."""
    return cas(Charge, charge_id, sources, status=ChargeStatus.VOIDED, failure_code=failure_code)


def lapse_intent(intent_id: str) -> bool:
    """``processing → canceled`` (``expired``): a capture found the authorization gone."""
    return cas(
        PaymentIntent,
        intent_id,
        [IntentStatus.PROCESSING],
        status=IntentStatus.CANCELED,
        cancellation_reason=CancellationReason.EXPIRED,
        canceled_at=Now(),
        amount_capturable=0,
    )


def late_success(charge_id: str, amount_captured: int, sources) -> bool:
    """``voiding | failed → succeeded``: the rail reports the money moved although vpay voided
    (or failed) the charge."""
    return cas(Charge, charge_id, sources, status=ChargeStatus.SUCCEEDED, amount_captured=amount_captured)


# --- the authorization's expiry ----------------------------------------------------------

# Seconds until the authorization of an authorized charge expires (negative once it has; 0,
# expired, for one without an authorized_at, which only a hand edit leaves), on the database
# clock; no row when the charge is not authorized. charges_pkey.
_AUTHORIZATION_LEFT = """
SELECT coalesce(extract(epoch FROM authorized_at + make_interval(secs => %s) - now())::float8, 0)
  FROM charges WHERE id = %s AND status = 'authorized'
"""


def authorization_left(charge_id: str, expiry_seconds: float) -> float | None:
    with connection.cursor() as cursor:
        cursor.execute(_AUTHORIZATION_LEFT, [expiry_seconds, charge_id])
        r = cursor.fetchone()
    return None if r is None else r[0]
