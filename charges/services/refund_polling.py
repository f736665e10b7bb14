"""The refund worker: ``poll_refund`` sends a refund to its rail and polls it to a settled state.

Not fenced (it calls the network): idempotent by construction, as the charge poll is.
Every write is a compare-and-swap that matches nothing on a re-run, and a send reuses the
refund's id as the rail's reference and idempotency key. The request row is committed
before each call (``rail_calls``), so a worker killed inside the call leaves "sent, no
answer", and the replacement asks the rail about it rather than sending it again.
"""

from __future__ import annotations

import logging

from charges import refund_repository
from charges.rails import get_rail
from charges.rails.adapter import RailConfigurationError, RailRejected, RailUnavailable
from charges.recovery import SubmitEvidence
from charges.refund_policy import RefundPolicy, RefundStep, from_settings, recovery_step, settle_refund
from charges.refund_repository import RefundRow
from charges.services import rail_calls, rail_slots, refunds
from charges.services.rail_gate import RailDeferred, worker_share
from charges.settlement import Settlement
from charges.states import REFUND_TERMINAL, RailStatus, RefundStatus
from jobs import registry
from jobs.kinds import JobKind
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay.errors import ConfigurationError, error_chain

logger = logging.getLogger(__name__)

REFUND_PAYLOAD = PayloadSchema(required={"refund_id": "str"})
# One rail call (bounded by VPAY_RAIL_TIMEOUT_SECONDS) and a few short statements.
RAIL_JOB_TIMEOUT_SECONDS = 90.0

POLL_NOT_CANCELLABLE = (
    "a refund's poll is what sends it to the rail and brings it to succeeded, failed or "
    "unresolved; a cancelled poll leaves the refund in flight, its amount held. Resolve the "
    "refund at the rail instead; its next poll records the rail's answer (docs/charges.md)"
)


@registry.register(
    JobKind.POLL_REFUND,
    schema=REFUND_PAYLOAD,
    timeout_seconds=RAIL_JOB_TIMEOUT_SECONDS,
    cancellable=False,
    not_cancellable_reason=POLL_NOT_CANCELLABLE,
)
def poll_refund(ctx: JobContext) -> Outcome:
    """One step: terminal guard, horizon, send or ask, settlement table, next rung.

    The horizon is read once, before anything else can return, for the reason the charge
    poll gives: every arm below ends in a rung of the ladder, and a refund the rail never
    knows must still reach a human.
    """
    policy = from_settings()
    row = refund_repository.read_for_poll(ctx.payload["refund_id"])
    if row is None:
        logger.warning("poll for a refund that does not exist", extra={"refund_id": ctx.payload["refund_id"]})
        return Outcome.done()
    rail_slots.running(row.rail, refund_repository.poll_dedupe_key(row.id))
    if row.status in REFUND_TERMINAL:
        return Outcome.done()
    past = policy.past(row.age)

    rail = get_rail(row.rail)
    if rail is None:
        raise ConfigurationError(f"refund {row.id}: rail {row.rail!r} is no longer configured")
    # Sent when the rail cannot have it: no submit ever went out (also for a refund escalated
    # past the horizon before its first send: a rail down for a day, credentials replaced),
    # or a 404 streak spanning the window says it never arrived.
    sending = (row.status == RefundStatus.UNRESOLVED and row.submit is SubmitEvidence.NEVER) or (
        row.status == RefundStatus.SUBMITTING
        and recovery_step(row.submit, row.not_found_count, row.not_found_age, policy) is RefundStep.SEND
    )
    share = worker_share(ctx.worker_concurrency)
    retry_after = 0.0
    try:
        if sending:
            if row.submit is not SubmitEvidence.NEVER:
                refund_repository.forget_not_found(row.id)  # unanswered, it is asked about next
            # Whether this is a resend is the recording statement's finding, not this read's:
            # a run that read "never sent" while another run's send was going out resends.
            request_id, answer, resend = rail_calls.refund_submit(
                row.id, row.charge_id, rail, amount=row.amount, currency=row.currency, share=share
            )
            rail_calls.record_answer(request_id, answer)
        else:
            answer, resend = rail_calls.refund_status(row.id, row.charge_id, rail, share=share), False
        status, failure_code = answer.status, answer.failure_code
        if resend and status is RailStatus.FAILED:
            # "failed" to a resend says nothing of the first send, which may still complete:
            # failing the refund would give its amount back to be refunded twice. Only a
            # status read (or the first send's own answer) settles; this is a non-answer.
            logger.warning("rail answered a refund resend failed", extra={"refund_id": row.id})
            status, failure_code = RailStatus.UNAVAILABLE, None
    except RailDeferred as exc:
        # Nothing was sent. Before the horizon the poll waits; past it this is a non-answer.
        if not past:
            return _deferred(ctx, row, policy, exc)
        status, failure_code = RailStatus.UNAVAILABLE, None
    except RailUnavailable as exc:
        # Never a dead letter: the poll is the refund's liveness; the ladder paces the next ask.
        # A refused resend (rail_calls.ResendRefused: "duplicate reference", "already
        # refunded") is one too: an earlier send may have landed, so it proves nothing, and
        # failing it would give the amount back to be refunded again.
        logger.warning(
            "rail did not answer a refund request", extra={"refund_id": row.id, "error": error_chain(exc, 300)}
        )
        status, failure_code = RailStatus.UNAVAILABLE, None
        retry_after = exc.retry_after or 0.0
    except RailRejected as exc:
        if sending:
            # A definitive refusal of the first send (a resend's is ResendRefused, above):
            # the rail holds no refund.
            refunds.refund_fail(row=row, failure_code=refunds.REFUND_REJECTED)
            return Outcome.done()
        if past:
            return _escalate(row, policy, f"rail refused a refund poll: {error_chain(exc, 200)}")
        # A refused status read proves nothing either (the charge poll's rule): the next
        # rung, never a dead letter that would leave the refund with no poll.
        logger.warning("rail refused a refund poll", extra={"refund_id": row.id, "error": error_chain(exc, 300)})
        status, failure_code = RailStatus.UNAVAILABLE, None
    except RailConfigurationError as exc:
        if not past:
            raise  # our credentials: paged and dead-lettered; replayed once fixed, nothing failed
        return _escalate(row, policy, f"rail refused our credentials: {error_chain(exc, 200)}")

    if status == RailStatus.NOT_FOUND and row.status == RefundStatus.SUBMITTING:
        refund_repository.record_not_found(row.id)  # the evidence recovery_step reads next time
    settlement = settle_refund(row.status, status, past_horizon=past)
    if settlement is Settlement.IGNORE:
        return Outcome.done()
    if settlement is Settlement.SUCCEED:
        refunds.refund_succeed(row=row)
        return Outcome.done()
    if settlement is Settlement.FAIL:
        refunds.refund_fail(row=row, failure_code=failure_code)
        return Outcome.done()
    if settlement is Settlement.ESCALATE:
        return _escalate(row, policy, f"rail answered {status.value} past the horizon")
    if settlement is Settlement.MARK_SUBMITTED:
        refund_repository.mark_pending(row.id)
    return Outcome.reschedule_in(
        max(policy.next_wait(row.polls, row.age), retry_after), f"rail answered {status.value}"
    )


def _deferred(ctx: JobContext, row: RefundRow, policy: RefundPolicy, exc: RailDeferred) -> Outcome:
    """Held back by the rail's guards: deferred (no attempt spent) while deferrals are left,
    then the next rung, never a dead letter (the horizon is what tells a human)."""
    if ctx.deferrals_left > 0:
        if exc.for_slot:
            rail_slots.wait_for_slot(row.rail, refund_repository.poll_dedupe_key(row.id))
        return Outcome.defer(exc.delay_after(ctx.deferrals), str(exc))
    return Outcome.reschedule_in(
        max(policy.next_wait(row.polls, row.age), exc.delay_seconds), f"{exc}; deferral ceiling reached: next rung"
    )


def _escalate(row: RefundRow, policy: RefundPolicy, reason: str) -> Outcome:
    refunds.refund_escalate(row=row, reason=reason, alert_period=policy.past_horizon_every)
    return Outcome.reschedule_in(policy.past_horizon_every, "unresolved: polling hourly")
