"""An authorization's expiry: the authorized charge's own poll is its timer.

While a charge is ``authorized`` its poll job waits (parked: jobs due far out cost the
claim nothing) until the authorization is ``VPAY_AUTHORIZATION_EXPIRY_SECONDS`` old on the
database clock. A capture or a cancel wakes it earlier (``capture.wake_poll``); a poll that
finds the authorization expired voids it: under the intent's row lock (the lock a capture
and a cancel take, so exactly one of them moves the authorization) the charge goes
``authorized → voiding`` and the intent ``requires_capture → canceled`` (``expired``), with
``payment_intent.canceled``; the same poll then sends the void
(``charges.services.capture_polling``). Being the charge's poll, the timer is restored by
the backstop scan like any poll, and never races a capture for the job.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from charges import capture_repository, guarded
from charges.repository import ChargeRow
from charges.services.checkout_expiry import expire_session_of_canceled_intent
from charges.services.transitions import intent_for_event
from charges.states import CancellationReason
from charges.wire import render_intent
from jobs.runner.outcome import Outcome
from webhooks.event_types import EventType
from webhooks.events import emit

logger = logging.getLogger(__name__)


def wait_or_expire(row: ChargeRow) -> Outcome:
    """The authorized charge's poll: wait out the authorization, or void it once it expired."""
    left = capture_repository.authorization_left(row.id, settings.VPAY_AUTHORIZATION_EXPIRY_SECONDS)
    if left is None:
        return Outcome.reschedule_in(0, "no longer authorized")  # a capture or a cancel moved it: drive that
    if left > 0:
        return Outcome.reschedule_in(left, "authorized: waiting for a capture, a cancel or the expiry")
    expire(row)
    return Outcome.reschedule_in(0, "authorization expired: voiding it")


def expire(row: ChargeRow) -> bool:
    """``authorized → voiding`` and the intent ``canceled`` (``expired``), with its event;
    False when a capture or a cancel moved the charge first."""
    with transaction.atomic():
        guarded.lock_intent(row.intent_id)
        if not capture_repository.start_void(row.id):
            return False
        if not capture_repository.cancel_authorized_intent(row.intent_id, CancellationReason.EXPIRED):
            # An authorized charge whose intent does not require capture: no path writes that.
            # Roll back whole; the job's retries and then its dead letter put it before a human.
            raise RuntimeError(f"charge {row.id} is authorized but its intent {row.intent_id} is not requires_capture")
        expire_session_of_canceled_intent(row.intent_id)
        intent = intent_for_event(row.intent_id)
        emit(intent.merchant_id, EventType.PAYMENT_INTENT_CANCELED, render_intent(intent, for_event=True))
    logger.info("authorization expired uncaptured; voiding it", extra={"charge_id": row.id, "intent_id": row.intent_id})
    return True
