"""The webhooks app's job kinds: registered with the queue from ``WebhooksConfig.ready()``."""

from __future__ import annotations

import logging

from django.conf import settings

from jobs import registry
from jobs.kinds import JobKind
from jobs.primitives import breakers
from jobs.primitives.retry import RetryPolicy
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay import faultpoints
from webhooks.services import carrying, delivery, fanout, host_breakers, scan

logger = logging.getLogger("webhooks.handlers")

# The deliver job's own retry policy only covers a failure of vpay's side (the database
# unreachable mid-handler); the receiver's failures ride the delivery ladder, never this.
DELIVER_RETRY = RetryPolicy(max_attempts=10, base_seconds=5.0, cap_seconds=300.0)


@registry.register(
    JobKind.WEBHOOK_FAN_OUT,
    schema=PayloadSchema(),
    timeout_seconds=120.0,
    singleton=registry.Singleton(),
)
def fan_out(ctx: JobContext) -> Outcome:
    """The outbox drain. A pass that made progress runs again at once (a full page means
    more is waiting); a pass that made none waits the idle period, so a page of failing
    events is not a hot loop. An emit that commits while a pass runs wakes this job
    (jobs.port.pull_forward), so that wait is cut short: its event is not left behind."""
    result = fanout.drain_once()
    if result.seen:
        logger.info("fan-out pass", extra=vars(result))
    if result.progress:
        return Outcome.reschedule_in(0)
    return Outcome.reschedule_in(settings.VPAY_WEBHOOK_FAN_OUT_IDLE)


def _deliver_timeout() -> float:
    # Two attempts' budgets (a batch's are sent at once, and a next batch is begun only
    # within carrying.ROUNDS_SECONDS of the first one's end) plus the short transactions.
    return 2 * settings.VPAY_WEBHOOK_TIMEOUT + 15.0


@registry.register(
    JobKind.WEBHOOK_DELIVER,
    schema=PayloadSchema(required={"delivery_id": "int"}),
    timeout_seconds=_deliver_timeout(),
    retry=DELIVER_RETRY,
    subject=lambda payload: f"delivery:{payload['delivery_id']}",
    # Its run time is the merchant's server's: never all of a worker (docs/runner.md "Reserved executors").
    merchant_paced=True,
)
def deliver(ctx: JobContext) -> Outcome:
    """One attempt of one delivery, and beside it a batch of its endpoint's other due
    deliveries whose jobs it holds (``webhooks.services.carrying``). Unfenced: it calls the
    network; every write is a CAS.

    The merchant's breaker for the endpoint's host and port is asked first: open, the job defers before any attempt is claimed
    (no rung spent). With no deferrals left the attempt goes ahead regardless, so the
    ladder still ends the delivery (host_breakers' docstring)."""
    ticket = None
    # One read of the delivery, its event, endpoint and secrets: it names the host's breaker
    # and is what the attempt sends (whether to send is decided under the row lock below).
    # Each step goes through its group commit: the executors at the same step share one batch.
    loaded = delivery.LOADS.submit(ctx.payload["delivery_id"])
    name = host_breakers.breaker_named_for(loaded.event.merchant_id, loaded.endpoint_url) if loaded else None
    if name is not None and ctx.deferrals_left > 0:
        try:
            ticket = breakers.admit(name, host_breakers.limits())
        except breakers.BreakerOpen as exc:
            return Outcome.defer(exc.delay_seconds, str(exc))
    begun = delivery.BEGINS.submit((ctx.payload["delivery_id"], delivery.worker_share(ctx.worker_concurrency)))
    if begun.kind is not delivery.Begin.CLAIMED and ticket is not None:
        breakers.release(ticket)  # nothing was sent
    if begun.kind in (delivery.Begin.GONE, delivery.Begin.HELD):
        return Outcome.done()  # held: the delivery stays pending; re-enabling enqueues it again
    if begun.kind is not delivery.Begin.CLAIMED:
        # Not due, another attempt's lease is live, or the endpoint is at its cap: look
        # again later. Not a failure, and no attempt of the job is spent.
        return Outcome.reschedule_in(max(begun.wait, 0.0) + 0.05, begun.kind.value)
    assert begun.lease is not None
    batch, answers = None, []
    try:
        faultpoints.reached("webhook.attempt_recorded")
        # The own attempt leaves at once, on a send thread, while this thread begins the
        # endpoint's other due deliveries beside it (none at idle; a batch under a backlog):
        # only on a closed breaker's ticket, never past an open one (a job out of deferrals
        # goes alone) nor beside a half-open one's probe.
        own = carrying.start_send(begun.lease, loaded, ctx.worker_concurrency)
        if ticket is not None and not ticket.probe and begun.others_due:
            batch = carrying.start_batch(begun.lease, ctx.worker_concurrency)
        attempted = own.result()
        faultpoints.reached("webhook.answered", str(attempted.attempt_state))
        # Recorded on its own, through the group commit, whatever becomes of the batch.
        recorded = delivery.RECORDS.submit((begun.lease, attempted))
    finally:
        delivery.release(begun)
        if batch is not None:
            answers = carrying.finish_batch(batch)  # never raises: the carried attempts' own records
    if batch is not None:
        answers = carrying.carry_on(begun.lease, batch, answers, ctx.worker_concurrency)
    if ticket is not None:
        for one in (attempted, *answers):
            host_breakers.report(ticket, one.attempt_state, one.status_code)
    if recorded.stale:
        return Outcome.reschedule_in(0, "stale attempt: look at the delivery again")
    if recorded.delivery_state == delivery.DeliveryState.PENDING:
        # The delivery's next_attempt_at was set from now() in the same statement; this
        # run_at is computed later, so the job never runs before the delivery is due.
        next_delay = delivery.delivery_delay(begun.lease.rung, settings.VPAY_WEBHOOK_RETRY_SCHEDULE)
        return Outcome.reschedule_in(next_delay or 0.0, "next rung of the delivery ladder")
    return Outcome.done()


@registry.register(
    JobKind.WEBHOOK_SCAN,
    schema=PayloadSchema(),
    timeout_seconds=120.0,
    singleton=registry.Singleton(),
)
def scan_deliveries(ctx: JobContext) -> Outcome:
    """The backstop: recover expired attempt leases, re-enqueue due deliveries without a job."""
    try:
        result = scan.scan_once()
    except Exception:
        # Reaching the alert is the point: a backstop nobody notices has stopped is not there.
        logger.exception("the webhook delivery backstop scan failed", extra={"alert": True})
        raise
    if result.recovered or result.exhausted or result.requeued:
        logger.info("webhook backstop scan", extra=vars(result))
    return Outcome.reschedule_in(settings.VPAY_WEBHOOK_SCAN_PERIOD)
