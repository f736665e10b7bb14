"""What to do with a charge ``capturing`` or ``voiding``, before and after the rail is asked.
Pure; no database, no clock (ages come in as durations the database measured).

A capture and a void are each one request (``POST …/capture``, ``POST …/void``) with an
idempotency key of its own, so the rail holds one capture (one void) per charge however
often it is sent. vpay still sends each only where the evidence says the rail does not have
it, as it does a charge's submit:

* :func:`capture_step`: never sent → ``SEND``; sent (answered, refused, or not answered) →
  ``ASK`` the charge's status, the rail's own word on whether it landed.
* :func:`settle_capture`: the answer (of the send, or of the status read), to one action.
  A status read still saying ``authorized`` after a send nobody heard back from sends again
  (``SEND_AGAIN``) only once that send is a window old, never within it (the first may
  still land).
"""

from __future__ import annotations

import enum

from charges.recovery import SubmitEvidence
from charges.states import ChargeStatus, RailStatus


class CaptureStep(enum.StrEnum):
    SEND = "send"  # no request went out for this operation: send it
    ASK = "ask"  # one went out: ask the rail about the charge


def capture_step(sent: SubmitEvidence) -> CaptureStep:
    """Send the capture (void) only if none went out; otherwise read the charge's status."""
    return CaptureStep.SEND if sent is SubmitEvidence.NEVER else CaptureStep.ASK


class CaptureSettlement(enum.StrEnum):
    CAPTURED = "captured"  # -> succeeded (intent succeeded, amount_received; charge.captured)
    VOIDED = "voided"  # -> voided: the hold is released
    LAPSED = "lapsed"  # capturing, but the rail holds nothing to capture: -> voided, intent canceled, alert
    LATE_SUCCESS = "late_success"  # voiding, but the money moved: -> succeeded, recorded and alerted
    REFUSED = "refused"  # the rail refused the first send for good and still holds the authorization
    SEND_AGAIN = "send_again"  # the rail still holds the authorization untouched: send again (same key)
    STAY = "stay"  # nothing to write; the next rung
    ESCALATE = "escalate"  # past the horizon without a final answer: alert (hourly), keep asking


_NON_FINAL = frozenset({RailStatus.PENDING, RailStatus.NOT_FOUND, RailStatus.UNAVAILABLE})


def settle_capture(
    status: ChargeStatus, answer: RailStatus, *, send_is_stale: bool, past_horizon: bool, refused: bool = False
) -> CaptureSettlement:
    """The table (``|``: before / past the horizon; ``stale``: the last send is a window old;
    ``refused``: the rail refused the operation's first send for good, a 4xx).

    ==========  ==========  ============  ==============  ==============================  ===========
    charge      succeeded   canceled      failed          authorized                      other
    ==========  ==========  ============  ==============  ==============================  ===========
    capturing   CAPTURED    LAPSED        LAPSED          REFUSED if refused, else        STAY
                                                          SEND_AGAIN if stale, else STAY
    voiding     LATE_SUCC.  VOIDED        VOIDED          the same                        see below
    ==========  ==========  ============  ==============  ==============================  ===========

    A void answered 404 (or a status read answering 404) says the rail holds nothing under
    the reference: ``VOIDED``. Any other non-final answer (pending, unavailable, and a 404
    to a capture) is ``STAY`` before the horizon and ``ESCALATE`` past it, as is an
    ``authorized`` that may not be sent again yet. A final answer is acted on whenever it
    comes. A refusal is judged by the status read after it, never alone: ``authorized``
    then is ``REFUSED`` (the hold stands, the operation did not happen), while ``canceled``
    or ``failed`` say the authorization is gone (the row above).
    """
    status, answer = ChargeStatus(status), RailStatus(answer)
    if status not in (ChargeStatus.CAPTURING, ChargeStatus.VOIDING):
        raise ValueError(f"settle_capture() is for capturing and voiding charges, not {status}")
    capturing = status is ChargeStatus.CAPTURING
    if answer is RailStatus.SUCCEEDED:
        return CaptureSettlement.CAPTURED if capturing else CaptureSettlement.LATE_SUCCESS
    if answer in (RailStatus.CANCELED, RailStatus.FAILED):
        return CaptureSettlement.LAPSED if capturing else CaptureSettlement.VOIDED
    if answer is RailStatus.NOT_FOUND and not capturing:
        return CaptureSettlement.VOIDED
    if answer is RailStatus.AUTHORIZED and refused:
        return CaptureSettlement.REFUSED
    if answer is RailStatus.AUTHORIZED and send_is_stale:
        return CaptureSettlement.SEND_AGAIN
    assert answer in _NON_FINAL or answer is RailStatus.AUTHORIZED
    return CaptureSettlement.ESCALATE if past_horizon else CaptureSettlement.STAY
