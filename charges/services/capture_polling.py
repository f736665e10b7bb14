"""The charge poll's capture phase: a charge ``capturing`` or ``voiding`` is driven to the
rail's final word by the same ``poll_charge`` job that settled it (one live poll per charge,
restored by the backstop scan), one step a run.

Each run reads the phase (``capture_repository.read_phase``), sends the operation if none
went out since it was asked for, else reads the charge's status, and acts on the answer
through ``charges.capture_table``. Every request is recorded (committed) before it is sent,
with the operation's own idempotency key, so a worker killed inside the call leaves "sent,
no answer" and its successor asks rather than sends; a capture is sent again only when the
rail still reports the authorization untouched a window after the last send, and then
under the same key. Not fenced (it calls the network): every write is a compare-and-swap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from charges import capture_repository
from charges.capture_repository import PhaseRow
from charges.capture_table import CaptureSettlement, CaptureStep, capture_step, settle_capture
from charges.ladder import past_the_horizon, poll_delay
from charges.policy import RecoveryPolicy
from charges.rails import RailConfig, get_rail
from charges.rails.adapter import RailAnswer, RailConfigurationError, RailRejected, RailUnavailable
from charges.recovery import SubmitEvidence
from charges.repository import ChargeRow
from charges.services import capture_transitions, rail_calls
from charges.services.rail_gate import RailDeferred, worker_share
from charges.states import ChargeStatus, RailStatus
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay.errors import ConfigurationError, error_chain

logger = logging.getLogger(__name__)

Deferred = Callable[[JobContext, ChargeRow, RecoveryPolicy, RailDeferred], Outcome]


def drive(ctx: JobContext, row: ChargeRow, policy: RecoveryPolicy, deferred: Deferred) -> Outcome:
    """One step of the capture phase; ``deferred`` is the poll's answer to the rail's guards."""
    phase = capture_repository.read_phase(row.id)
    if phase is None:
        # The phase ended between the poll's read and this one: the poll, run again, reads
        # where the charge is now (authorized again waits for its expiry; terminal is done).
        return Outcome.reschedule_in(0, "the capture phase moved on")
    past = past_the_horizon(phase.age, policy)
    rail = get_rail(row.rail)
    if rail is None:
        raise ConfigurationError(f"charge {row.id}: rail {row.rail!r} is no longer configured")
    share = worker_share(ctx.worker_concurrency)
    sending = capture_step(phase.sent) is CaptureStep.SEND
    stale = phase.sent is not SubmitEvidence.NEVER and (phase.last_send_age or 0.0) >= policy.not_found_window
    refused = phase.refused
    for _ in range(3):  # a send, a status read after a refusal, a resend: at most one of each
        retry_after = 0.0
        try:
            answer = _send(row, phase, rail, share) if sending else _ask(row, rail, share)
            status = answer.status
        except RailDeferred as exc:
            if not past:
                return deferred(ctx, row, policy, exc)
            status, answer = RailStatus.UNAVAILABLE, None
        except RailUnavailable as exc:  # a refused resend (ResendRefused) included: it proves nothing
            logger.warning(
                "rail did not answer a capture-phase request",
                extra={"charge_id": row.id, "error": error_chain(exc, 300)},
            )
            status, answer, retry_after = RailStatus.UNAVAILABLE, None, exc.retry_after or 0.0
        except RailRejected as exc:
            logger.warning(
                "rail refused a capture-phase request", extra={"charge_id": row.id, "error": error_chain(exc, 300)}
            )
            if sending and not refused:
                # The operation's first send, refused for good: what it means is the rail's
                # status of the charge (the hold stands, or is gone), asked now. A crash
                # before that read leaves the refusal recorded: the next run asks too.
                sending, refused = False, True
                continue
            status, answer = RailStatus.UNAVAILABLE, None  # a refused status read: no word
        except RailConfigurationError as exc:
            if not past:
                raise  # our credentials: paged and dead-lettered, replayed once fixed
            status, answer = RailStatus.UNAVAILABLE, None
            logger.error("rail refused our credentials", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        settlement = settle_capture(
            phase.status, status, send_is_stale=stale and not sending, past_horizon=past, refused=refused
        )
        if settlement is not CaptureSettlement.SEND_AGAIN:
            return _act(row, phase, policy, settlement, status, answer, retry_after)
        sending, stale = True, False
    return Outcome.reschedule_in(poll_delay(phase.polls, policy), "sent again")


def _send(row: ChargeRow, phase: PhaseRow, rail: RailConfig, share: int | None) -> RailAnswer:
    if phase.status == ChargeStatus.CAPTURING:
        amount = phase.amount_to_capture or row.amount
        answer, _ = rail_calls.capture(row.id, rail, amount=amount, attempt=phase.earlier_phases, share=share)
    else:
        answer, _ = rail_calls.void(row.id, rail, share=share)
    return answer


def _ask(row: ChargeRow, rail: RailConfig, share: int | None) -> RailAnswer:
    return rail_calls.status(row.id, rail, pay_token=row.pay_token, share=share)


def _act(
    row: ChargeRow,
    phase: PhaseRow,
    policy: RecoveryPolicy,
    settlement: CaptureSettlement,
    status: RailStatus,
    answer: RailAnswer | None,
    retry_after: float,
) -> Outcome:
    if settlement is CaptureSettlement.CAPTURED:
        capture_transitions.captured(row, _captured_amount(row, phase, answer))
    elif settlement is CaptureSettlement.VOIDED:
        capture_transitions.voided(row)
    elif settlement is CaptureSettlement.LAPSED:
        capture_transitions.lapsed(row, status.value)
    elif settlement is CaptureSettlement.LATE_SUCCESS:
        capture_transitions.late_success(row, _captured_amount(row, None, answer))
    elif settlement is CaptureSettlement.REFUSED:
        if phase.status == ChargeStatus.CAPTURING:
            capture_transitions.refused(
                row,
                f"the rail refused the capture and still reports the charge {status}",
                attempt=phase.earlier_phases,
            )
            # Authorized again: the poll, run again, waits for the expiry (a capture asked for
            # meanwhile has woken it).
            return Outcome.reschedule_in(0, "capture refused: authorized again")
        capture_transitions.void_refused(row, phase)
        return Outcome.reschedule_in(policy.past_horizon_every, "void refused: a human's, asked hourly")
    elif settlement is CaptureSettlement.ESCALATE:
        capture_transitions.escalate(
            row, phase, f"rail answered {status.value} past the horizon", alert_period=policy.past_horizon_every
        )
        return Outcome.reschedule_in(poll_delay(phase.polls, policy, past_horizon=True), "unresolved: polling hourly")
    else:
        return Outcome.reschedule_in(max(poll_delay(phase.polls, policy), retry_after), f"rail answered {status.value}")
    return Outcome.done()


def _captured_amount(row: ChargeRow, phase: PhaseRow | None, answer: RailAnswer | None) -> int:
    """What the rail says it captured, believed within the charge's amount; else what this
    capture asked for (``phase``), or for a late success the whole amount."""
    said = answer.amount_captured if answer is not None else None
    if said is not None and 0 < said <= row.amount:
        return said
    return (phase.amount_to_capture if phase is not None else None) or row.amount
