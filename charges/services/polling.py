"""The charge worker: ``poll_charge`` and ``resubmit_charge`` (the backstop scan that gives
every live charge a poll: ``backstop_scan``).

All three call the network, so none is fenced: each is idempotent by construction — every
write is a compare-and-swap that matches nothing on a re-run, and a resubmission reuses
the charge's reference, which is the rail's idempotency key.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from django.db import transaction

from charges import repository
from charges.ladder import past_the_horizon, poll_delay
from charges.policy import RecoveryPolicy, from_settings
from charges.rails import get_rail
from charges.rails.adapter import RailConfigurationError, RailRejected, RailUnavailable
from charges.recovery import Step, recovery_step
from charges.repository import ChargeRow
from charges.services import (
    authorization_expiry,
    capture_polling,
    poll_batch,
    rail_calls,
    rail_slots,
    status_answers,
    transitions,
)
from charges.services.rail_gate import RailDeferred, worker_share
from charges.settlement import Settlement, settle
from charges.states import CHARGE_CAPTURE_PHASE, CHARGE_TERMINAL, ChargeStatus, RailFlow, RailStatus
from jobs import port as queue
from jobs import registry
from jobs.kinds import JobKind
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay.errors import ConfigurationError, error_chain

logger = logging.getLogger(__name__)

CHARGE_PAYLOAD = PayloadSchema(required={"charge_id": "str"})
# A rail call is bounded by VPAY_RAIL_TIMEOUT_SECONDS (20 s by default); a poll makes one, plus
# a few short statements, and then its carried batch's, each only while it would end within
# the batch's hold (twice the timeout + 10 s from its start: charges.services.poll_batch). The timeout
# sits above both.
RAIL_JOB_TIMEOUT_SECONDS = 90.0


# Cancelling a poll settles nothing: the charge stays in flight at the rail, the backstop
# scan enqueues a new poll for it, and a cancelled run could stop between the rail's answer
# and its settlement. The operator acts on the charge, never on its poll.
POLL_NOT_CANCELLABLE = (
    "a charge's poll is how its charge reaches succeeded, failed or unresolved; a cancelled poll "
    "leaves the charge in flight and the backstop scan enqueues it again. Resolve the charge "
    "instead: settle it at the rail, and its next poll records the rail's answer (docs/charges.md)"
)


@registry.register(
    JobKind.POLL_CHARGE,
    schema=CHARGE_PAYLOAD,
    timeout_seconds=RAIL_JOB_TIMEOUT_SECONDS,
    cancellable=False,
    not_cancellable_reason=POLL_NOT_CANCELLABLE,
)
def poll_charge(ctx: JobContext) -> Outcome:
    """One poll: terminal guard, horizon, crash recovery, rail, settlement table, next rung.

    The order is load-bearing twice over. The horizon is evaluated once, *above* the
    crash-recovery block, because that block can return without reaching anything below it
    — and one of its arms, Resubmit, returns a rung of the ladder: a charge whose rail
    answers 404 forever would cycle resubmit → ladder → resubmit and never be escalated if
    the horizon were asked afterwards. Evaluated once, because two readings of a moving
    clock can disagree, and this one decides whether a human is told.
    """
    policy = from_settings()
    row = repository.read_for_poll(ctx.payload["charge_id"])
    # 1. The terminal guard. A poll of a settled (or vanished) charge is a no-op: this is
    #    what makes a re-run after a crash between the settlement and the ack harmless.
    if row is None:
        logger.warning("poll for a charge that does not exist", extra={"charge_id": ctx.payload["charge_id"]})
        return Outcome.done()
    rail_slots.running(row.rail, repository.poll_dedupe_key(row.id))
    if row.status in CHARGE_TERMINAL:
        return Outcome.done()
    if row.status == ChargeStatus.AUTHORIZED:
        return authorization_expiry.wait_or_expire(row)  # nothing to ask the rail: wait for the merchant
    if row.status in CHARGE_CAPTURE_PHASE:
        return capture_polling.drive(ctx, row, policy, _deferred)

    # 2. The horizon: a property of the charge and the database clock alone (row.age was
    #    measured by the statement that read the row). It does not decide whether the rail
    #    is asked, only what happens to an answer short of a terminal one.
    past = past_the_horizon(row.age, policy)

    # 3. Crash recovery, for submitting charges only.
    if row.status == ChargeStatus.SUBMITTING:
        action = recovery_step(row.evidence(), policy)
        if action.step is Step.WAIT:
            return _wait(row, action.wait_seconds, policy)
        if action.step is Step.FAIL_DEAD_ORDER:
            if not transitions.fail_submitting(row.id, row.intent_id, transitions.DEAD_ORDER, rail=row.rail):
                # The charge left submitting between our read and the guarded write: a
                # confirm's compare-and-swap won, and its URL may be in the payer's hands.
                # This job is the charge's only poll: keep it, and run again now to ask
                # the rail.
                return Outcome.reschedule_in(0, "left submitting under a dead-order check")
            return Outcome.done()
        if action.step is Step.RESUBMIT:
            return resubmit_then_escalate_if_late(row, past, policy)
        # Step.POLL: ask the rail whether it has it.

    # 4. The rail.
    rail = get_rail(row.rail)
    if rail is None:
        raise ConfigurationError(f"charge {row.id}: rail {row.rail!r} is no longer configured")
    # The merchant's other due polls on this rail ride along, each asked after this one
    # (charges.services.poll_batch); not past the horizon, where each poll escalates alone.
    started = time.monotonic()
    batch = None if past or row.status != ChargeStatus.SUBMITTED else poll_batch.start_safely(row, rail, policy)
    try:
        return _ask_the_rail(ctx, row, rail, past, policy, batch, started)
    finally:
        if batch is not None:
            poll_batch.finish(batch, policy, after_answer, started=started)


def _ask_the_rail(
    ctx: JobContext,
    row: ChargeRow,
    rail,
    past: bool,
    policy: RecoveryPolicy,
    batch: poll_batch.Batch | None,
    started: float,
) -> Outcome:
    """Step 4 of a poll, then :func:`after_answer`."""
    retry_after = 0.0
    try:
        request_id, answer = rail_calls.status_unrecorded(
            row.id, rail, pay_token=row.pay_token, share=worker_share(ctx.worker_concurrency)
        )
    except RailDeferred as exc:
        if batch is not None:
            poll_batch.give_back_all(batch)  # the guards that held this request back hold the batch's
        # Nothing was sent (the rail's breaker is open, or it has its ceiling in flight).
        # Past the horizon that is a non-answer like any other, and escalates (a charge
        # nobody can ask about is exactly what a human must hear); before it, the poll waits.
        if not past:
            return _deferred(ctx, row, policy, exc)
        status, failure_code, pay_token = RailStatus.UNAVAILABLE, None, None
    except RailUnavailable as exc:
        # Never a dead letter, whatever the rail said (503, 429, an unreadable 200): the
        # poll is the charge's liveness, and a poll parked for review would leave a live
        # charge to a human. The ladder (and the rail's Retry-After) paces the next ask.
        logger.warning("rail did not answer a poll", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        status, failure_code, pay_token = RailStatus.UNAVAILABLE, None, None
        retry_after = exc.retry_after or 0.0
    except RailRejected as exc:
        # A status read cannot refuse money for good: whatever the rail means by a 4xx on
        # a GET, the charge may still move. A non-answer like any other (the next rung;
        # past the horizon the escalation, its alert and the hourly poll), never a dead
        # letter, which would leave a live charge with no poll at all.
        logger.warning("rail refused a poll", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        if past:
            return _escalate(row, policy, f"rail refused a poll: {error_chain(exc, 200)}")
        status, failure_code, pay_token = RailStatus.UNAVAILABLE, None, None
    except RailConfigurationError as exc:
        if not past:
            raise  # our credentials: paged and dead-lettered, replayed once fixed
        # Past the horizon, "the rail will not answer a day-old charge" is what a human
        # must hear, and escalation says it (with an hourly poll) where the rail's own
        # error would park the job. Only rail errors: a database error propagates as itself.
        return _escalate(row, policy, f"rail refused our credentials: {error_chain(exc, 200)}")
    else:
        # Recorded with its settlement, the slot handed to the batch's first (status_answers).
        outcome, handed = status_answers.settle_with_answer(
            request_id,
            answer,
            rail,
            partial(
                after_answer,
                row,
                answer.status,
                answer.failure_code,
                answer.pay_token,
                retry_after=0.0,
                past=past,
                policy=policy,
            ),
            next_charge_id=poll_batch.next_to_ask(batch, 0, started),
            hand_over_by=poll_batch.ask_deadline(started),
        )
        if batch is not None:
            batch.handed = handed
        return outcome

    return after_answer(row, status, failure_code, pay_token, retry_after=retry_after, past=past, policy=policy)


def after_answer(
    row: ChargeRow,
    status: RailStatus,
    failure_code: str | None,
    pay_token: str | None,
    *,
    retry_after: float,
    past: bool,
    policy: RecoveryPolicy,
) -> Outcome:
    """Steps 5 and 6 of a poll, once the rail's answer (or the non-answer ``UNAVAILABLE``) is
    in hand: the settlement table, then the next rung. A carried poll
    (``charges.services.poll_batch``) ends here too."""
    # 5. The settlement table. An authorization is believed only of a charge submitted as one.
    if status == RailStatus.AUTHORIZED and not row.manual_capture:
        logger.warning("rail answered authorized for an automatic charge", extra={"charge_id": row.id})
        status = RailStatus.UNAVAILABLE
    if status == RailStatus.NOT_FOUND and row.status == ChargeStatus.SUBMITTING:
        repository.record_not_found(row.id)  # the evidence the recovery table reads next time
    settlement = settle(row.status, status, past_horizon=past)
    if settlement is Settlement.IGNORE:
        return Outcome.done()
    if settlement is Settlement.SUCCEED:
        transitions.succeed(row)
        return Outcome.done()
    if settlement is Settlement.FAIL:
        transitions.fail(row, failure_code)
        return Outcome.done()
    if settlement is Settlement.AUTHORIZE:
        transitions.authorize(row)
        return authorization_expiry.wait_or_expire(row)
    if settlement is Settlement.ESCALATE:
        return _escalate(row, policy, f"rail answered {status.value} past the horizon")
    if settlement is Settlement.MARK_SUBMITTED:
        repository.mark_submitted(row.id, pay_token=pay_token, redirect_url=None)

    # 6. The next rung (row.polls counted the polls before this one), or later if the rail
    #    asked for that with Retry-After.
    return Outcome.reschedule_in(max(poll_delay(row.polls, policy), retry_after), f"rail answered {status.value}")


def _deferred(ctx: JobContext, row: ChargeRow, policy: RecoveryPolicy, exc: RailDeferred) -> Outcome:
    """A poll the rail's guards held back: deferred (no attempt spent, the rung not climbed:
    no request was made) while the job has deferrals left. At the deferral ceiling it is
    rescheduled on its ladder instead, never dead-lettered: the poll is the charge's
    liveness, and the horizon, not the ceiling, is what tells a human about a charge the
    rail has not been asked about (escalation, above). The reschedule resets the job's
    deferral count, so a rail down for hours costs a poll one rung per ceiling's worth."""
    if ctx.deferrals_left > 0:
        if exc.for_slot:
            rail_slots.wait_for_slot(row.rail, repository.poll_dedupe_key(row.id))
        return Outcome.defer(exc.delay_after(ctx.deferrals), str(exc))
    return Outcome.reschedule_in(
        max(poll_delay(row.polls, policy), exc.delay_seconds), f"{exc}; deferral ceiling reached: next rung"
    )


def _wait(row: ChargeRow, seconds: float, policy: RecoveryPolicy) -> Outcome:
    """Too young to recover: ask nothing, write nothing, come back once, just after the window.

    If the confirm's compare-and-swap committed while this worker held the job, run again
    at once rather than sit out the window on a charge that is already submitted: looked at
    here, and, for a confirm that commits after this look, by its pull-forward waking this
    running job (the reschedule below then runs it at once: jobs.port.pull_forward).
    """
    if repository.charge_status(row.id) != ChargeStatus.SUBMITTING:
        return Outcome.reschedule_in(0, "the confirm finished while this poll waited")
    return Outcome.reschedule_in(seconds + policy.wait_margin, "submitting and younger than the window: waiting")


def _escalate(row: ChargeRow, policy: RecoveryPolicy, reason: str) -> Outcome:
    transitions.escalate_to_unresolved(row, reason, alert_period=policy.past_horizon_every)
    return Outcome.reschedule_in(poll_delay(row.polls, policy, past_horizon=True), "unresolved: polling hourly")


def resubmit_then_escalate_if_late(row: ChargeRow, past: bool, policy: RecoveryPolicy) -> Outcome:
    """Both Resubmit arms go through here: enqueue the resubmission (committed first), then,
    past the horizon, escalate (a second transaction).

    The escalation usually supersedes the resubmission — the resubmit job finds the charge
    out of ``submitting`` and does nothing — but a worker that claims the resubmit between
    the two commits does send it. Both orders are safe: the reference never changes, and
    the escalation is idempotent. What the horizon guarantees is the alert and the hourly
    poll, not that a day-old charge is resent; once a human reconciles it, resending is
    their call.
    """
    queue.enqueue(
        JobKind.RESUBMIT_CHARGE,
        {"charge_id": row.id},
        dedupe_key=repository.resubmit_dedupe_key(row.id),
        tenant=row.merchant_id,
    )
    if past:
        return _escalate(row, policy, "submitting past the horizon; resubmitted")
    return Outcome.reschedule_in(poll_delay(row.polls, policy), "resubmitting")


@registry.register(JobKind.RESUBMIT_CHARGE, schema=CHARGE_PAYLOAD, timeout_seconds=RAIL_JOB_TIMEOUT_SECONDS)
def resubmit_charge(ctx: JobContext) -> Outcome:
    """Send a push charge's submit again, under the same reference (the rail's idempotency
    key). Only a definitive refusal of the charge's first send fails it (a crash before
    the confirm's POST left no request). A transient failure (no answer, 5xx, 409, 429, an
    unreadable 200) ends this job quietly: the charge stays ``submitting`` with the request
    row as evidence, and its poll, which owns the charge's liveness, comes back to the same
    recovery table on its next rung (and resubmits again there if the rail still does not
    know the charge). A dead letter here would be noise about a live charge.

    A refusal of a *resend* (``ResendRefused``: a submit went out before, as the statement
    recording this one found) proves nothing: the lost first send may have landed and the
    rail refuses the repeated reference. The charge stays ``submitting`` and the 404 streak
    that sent it here is forgotten, so its poll asks the rail on the next rung (a later
    success is recorded) rather than resending on every one; past the horizon it
    escalates as any charge the rail will not answer about does."""
    row = repository.read_for_poll(ctx.payload["charge_id"])
    if row is None or row.status != ChargeStatus.SUBMITTING or row.flow != RailFlow.PUSH:
        return Outcome.done()  # settled, escalated, or a redirect order (never resubmitted)
    rail = get_rail(row.rail)
    if rail is None:
        raise ConfigurationError(f"charge {row.id}: rail {row.rail!r} is no longer configured")
    try:
        request_id, answer = rail_calls.submit(
            row.id,
            rail,
            amount=row.amount,
            currency=row.currency,
            share=worker_share(ctx.worker_concurrency),
            capture=not row.manual_capture,
        )
    except RailRejected:  # of the first send: the rail holds no charge
        transitions.fail_submitting(row.id, row.intent_id, transitions.SUBMIT_REJECTED, rail=row.rail)
        return Outcome.done()
    except rail_calls.ResendRefused as exc:
        logger.warning("rail refused a resubmit", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        repository.forget_not_found(row.id)
        return Outcome.done()
    except RailUnavailable as exc:
        logger.warning("rail did not take a resubmit", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        return Outcome.done()
    except RailDeferred:
        return Outcome.done()  # nothing sent (breaker open, ceiling): the poll comes back to it, as above
    # RailConfigurationError propagates: paged and dead-lettered.
    with transaction.atomic():
        rail_calls.record_answer(request_id, answer)
        if repository.mark_submitted(row.id, pay_token=answer.pay_token, redirect_url=None):
            queue.pull_forward(repository.poll_dedupe_key(row.id))
    return Outcome.done()
