"""Confirming a payment intent (web process): three steps, in this order, on purpose.

1. One transaction: the intent ``requires_confirmation → processing`` (the guard against
   confirming twice), the charge in ``submitting``, and its poll job with ``run_at = now()
   + grace``. A charge exists iff its poll job does, so a crash anywhere after this commit
   leaves work the worker will find.
2. The rail call, outside any transaction, its request row committed before it is sent.
3. One transaction: the compare-and-swap ``submitting → submitted`` storing the
   ``pay_token`` / ``redirect_url``, the intent ``→ requires_action`` when a URL was handed
   out, and the poll job pulled forward to now.

The rail's guards (``rail_gate``), decided here for a merchant who is waiting:

* **Breaker open**: the confirm is refused with a 503 ``rail_unavailable`` (and
  ``Retry-After``) before step 1 writes anything. Sending into a rail known to be failing
  would hold a web thread for up to the rail timeout and most likely leave the charge
  ``submitting`` with an unanswered request — for a redirect charge a dead order failed a
  minute later, for the payer a failed payment. Refused, the intent stays
  ``requires_confirmation``: nothing was charged, nothing is ambiguous, and the merchant
  can confirm again. A confirm that finds the cool-down over is the breaker's probe.
* **The ceiling** of requests in flight does not apply: it bounds the worker's background
  polls, and refusing a payment because polls fill the rail would put them ahead of it.
  The confirm's request still counts as in flight for the polls.

Why the grace: a worker claiming the poll job while step 2 runs would find a charge in
``submitting`` — exactly what a crash leaves — and the recovery table answers ``Wait`` for
anything younger than the not-found window, so it would ask the rail nothing and park the
job for the rest of the window, leaving a charge that reached ``submitted`` seconds later
unasked about for most of a minute. The grace (one rail timeout) keeps workers away
during the call; step 3 then makes the job due at once. Should a worker claim it anyway (a
rail slower than the grace), the age guard leaves the charge alone, the confirm's
compare-and-swap wins, and the pull-forward in step 3 finds the parked job and makes it due.
"""

from __future__ import annotations

import logging
import math

from django.db import transaction

from charges import repository
from charges.inserts import insert_row
from charges.models import Charge, PaymentIntent
from charges.policy import from_settings
from charges.rails import get_rail
from charges.rails.adapter import RailConfigurationError, RailRejected, RailUnavailable
from charges.services import rail_calls, rail_gate, transitions
from charges.services.rail_gate import RailDeferred
from charges.states import INTENT_TERMINAL, CaptureMethod, ChargeStatus, IntentStatus, RailFlow
from charges.wire import render_intent
from jobs import port as queue
from jobs.kinds import JobKind
from jobs.operator.alerts import Severity, raise_alert
from merchants.models import Merchant
from vpay.errors import InvalidState, NotFound, Unavailable
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)


def open_charge(intent: PaymentIntent, rail, *, poll_delay: float) -> Charge:
    """The confirm's first commit, written inside the caller's transaction: the intent
    ``processing`` with ``payment_intent.processing``, its charge ``submitting`` (no request
    row yet) and the charge's poll job, due after ``poll_delay`` (the confirm's grace), which
    recovers the charge if the process dies before the rail is called."""
    if not repository.intent_to(intent.id, IntentStatus.PROCESSING, [IntentStatus.REQUIRES_CONFIRMATION]):
        # The caller holds the intent's lock and read it requires_confirmation: cannot happen.
        raise InvalidState("payment_intent_unexpected_state", "This PaymentIntent has already been confirmed.")
    intent.status = IntentStatus.PROCESSING
    charge = insert_row(
        Charge,
        intent=intent,
        merchant_id=intent.merchant_id,
        rail=rail.code,
        flow=rail.flow,
        manual_capture=intent.capture_method == CaptureMethod.MANUAL,
        amount=intent.amount,
        currency=intent.currency,
    )
    queue.enqueue(
        JobKind.POLL_CHARGE,
        {"charge_id": charge.id},
        dedupe_key=repository.poll_dedupe_key(charge.id),
        delay=poll_delay,
        tenant=intent.merchant_id,
    )
    repository.touch_customer(intent.customer_id)
    # Rendered from what this transaction wrote, not read back: the intent as locked with the
    # status just set, and the charge as inserted (its database defaults come back with the
    # INSERT). Reading it back compiled a joined queryset, a seventh of the confirm's CPU.
    intent.charge = charge
    emit(intent.merchant_id, EventType.PAYMENT_INTENT_PROCESSING, render_intent(intent, for_event=True))
    return charge


def confirm_intent(merchant: Merchant, intent_id: str) -> PaymentIntent:
    """Confirm the intent on its rail; returns it as it stands afterwards."""
    policy = from_settings()
    with transaction.atomic():
        intent, session_dead = repository.lock_for_confirm(merchant.id, intent_id)
        if intent is None:
            raise NotFound("resource_missing", f"No such payment_intent: {intent_id!r}.", param="id")
        if intent.status == IntentStatus.CANCELED:
            raise InvalidState("payment_intent_unexpected_state", "This PaymentIntent was canceled; create a new one.")
        if intent.status in INTENT_TERMINAL:
            raise InvalidState(
                "payment_intent_unexpected_state",
                f"This PaymentIntent has {intent.status}; create a new one to try again.",
            )
        if intent.status != IntentStatus.REQUIRES_CONFIRMATION:
            raise InvalidState("payment_intent_unexpected_state", "This PaymentIntent has already been confirmed.")
        # The expiry sweep locks this same intent row before it expires the session, so the
        # two serialize: a session is either expired before this confirm or not at all. A
        # session past its expires_at that the hourly sweep has not reached yet is just as
        # dead (the database's clock decides): confirming it would let the next sweep skip
        # it for its live charge and a payer pay a session the merchant saw expire.
        if session_dead:
            raise InvalidState(
                "checkout_session_expired", "This PaymentIntent's checkout session has expired; start a new one."
            )
        rail = get_rail(intent.rail)
        if rail is None:
            raise InvalidState("rail_unknown", f"The rail {intent.rail!r} is no longer configured.", param="rail")
        try:
            ticket = rail_gate.admit(rail.code)
        except RailDeferred as exc:
            # The rail's breaker is open: refused before anything is written (this
            # transaction rolls back), so the intent stays requires_confirmation and the
            # merchant may confirm again (a 503 is never stored under an Idempotency-Key).
            raise Unavailable(
                "rail_unavailable",
                f"The rail {rail.code!r} is failing right now; nothing was charged. Confirm again later.",
                retry_after=max(1, math.ceil(exc.delay_seconds)),
            ) from None
        charge = open_charge(intent, rail, poll_delay=policy.confirm_grace)

    try:
        request_id, answer = rail_calls.submit(
            charge.id,
            rail,
            amount=charge.amount,
            currency=charge.currency,
            ticket=ticket,
            ceiling=False,
            capture=not charge.manual_capture,
        )
    except RailUnavailable:
        # No answer we may act on (none, 5xx, 409, 429, an unreadable 200): the rail may
        # or may not have the charge, and only a definitive refusal ends one. It stays
        # submitting with its unanswered request row; the worker recovers it after the
        # window (push: ask the rail, resubmit if it never got it; redirect: fail it, since
        # no URL was handed out). The merchant sees processing / charge submitting.
        logger.warning("rail did not answer a submit", extra={"charge_id": charge.id, "rail": rail.code})
        return _reload(intent.id)
    except RailConfigurationError:
        with transaction.atomic():
            transitions.fail_submitting(charge.id, intent.id, transitions.RAIL_CONFIGURATION, rail=rail.code)
            raise_alert(
                key=f"rail_credentials_refused:{charge.id}",
                title=f"Rail {rail.code} refused our credentials (401/403) on a submit",
                source="charges.rail_configuration",
                severity=Severity.PAGE,
                details={"rail": rail.code, "charge_id": charge.id},
                correlation_id=charge.id,
            )
        return _reload(intent.id)
    except RailRejected:
        # The rail refused this charge for good (a refusing 4xx): it has no charge.
        transitions.fail_submitting(charge.id, intent.id, transitions.SUBMIT_REJECTED, rail=rail.code)
        return _reload(intent.id)

    with transaction.atomic():
        rail_calls.record_answer(request_id, answer)
        redirect_url = answer.redirect_url if rail.flow == RailFlow.REDIRECT else None
        moved = repository.mark_submitted(charge.id, pay_token=answer.pay_token, redirect_url=redirect_url)
        # The commit is the gate on the redirect: the URL reaches the payer only once the
        # pay_token needed to ask about it is durable.
        if moved:
            # What the compare-and-swap wrote, on the objects this confirm holds: the answer
            # is rendered from them, as of this commit, without reading them back.
            charge.status, charge.not_found_count, charge.first_not_found_at = ChargeStatus.SUBMITTED, 0, None
            charge.pay_token = answer.pay_token or charge.pay_token
            charge.redirect_url = redirect_url or charge.redirect_url
        # Whether the objects held are what the rows say: false once a guarded write missed.
        as_written = moved
        if moved and redirect_url:
            if repository.intent_to(intent.id, IntentStatus.REQUIRES_ACTION, [IntentStatus.PROCESSING]):
                intent.status = IntentStatus.REQUIRES_ACTION
                emit(
                    intent.merchant_id,
                    EventType.PAYMENT_INTENT_REQUIRES_ACTION,
                    render_intent(intent, for_event=True),
                )
            else:
                as_written = False  # the intent left processing meanwhile
        queue.pull_forward(repository.poll_dedupe_key(charge.id))
    if moved and not as_written:
        return _reload(intent.id)
    if not moved:
        # Cannot happen inside the window (the worker's age guard), and the rail timeout is
        # below the window (a startup check). Said loudly if it ever does.
        with transaction.atomic():
            raise_alert(
                key=f"confirm_cas_missed:{charge.id}",
                title=f"Confirm's compare-and-swap matched no charge in submitting ({charge.id})",
                source="charges.confirm",
                severity=Severity.ERROR,
                details={"charge_id": charge.id, "status": repository.charge_status(charge.id)},
                correlation_id=charge.id,
            )
        return _reload(intent.id)
    return intent


def _reload(intent_id: str) -> PaymentIntent:
    return PaymentIntent.objects.select_related("charge").get(pk=intent_id)
