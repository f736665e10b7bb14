"""Voiding, at its rail, a charge vpay failed on its own.

vpay fails a charge without the rail's word in two cases: a redirect order nobody was
handed a URL for (its submit's answer was lost; ``transitions.DEAD_ORDER``) and a submit the
rail refused (``transitions.SUBMIT_REJECTED``, which a rail that keeps a refused reference,
as a 409 "already in progress" does, may still hold). The rail may hold either, pending,
and a payer might yet pay it. So the transaction that fails it also enqueues ``void_charge``,
(``transitions.enqueue_void``), which sends the void (``POST …/void``, its request row committed first, idempotency key
``<ref>:void``) and reads the answer:

* ``canceled``, ``failed``, 404 (nothing held): done; the charge stays ``failed``;
* ``succeeded``: the money moved before the void could stop it. A **late success**: the
  charge is recorded ``succeeded`` with what was captured (never lost), its intent stays
  ``failed`` (the merchant was told so), and an operator is paged to refund or reconcile;
* anything else (no answer, a refusal, the rail's guards): the job's retries, then a dead
  letter in front of an operator with the charge named.

Not fenced (it calls the network): every write is a compare-and-swap, and a resend of the
void is the rail's same void.
"""

from __future__ import annotations

import logging

from charges import repository
from charges.rails import get_rail
from charges.rails.adapter import RailUnavailable
from charges.services import capture_transitions, rail_calls
from charges.services.rail_gate import RailDeferred, worker_share
from charges.states import ChargeStatus, RailStatus
from jobs import registry
from jobs.kinds import JobKind
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay.errors import ConfigurationError

logger = logging.getLogger(__name__)

RAIL_JOB_TIMEOUT_SECONDS = 90.0


@registry.register(
    JobKind.VOID_CHARGE,
    schema=PayloadSchema(required={"charge_id": "str"}),
    timeout_seconds=RAIL_JOB_TIMEOUT_SECONDS,
)
def void_charge(ctx: JobContext) -> Outcome:
    row = repository.read_for_poll(ctx.payload["charge_id"])
    if row is None or row.status != ChargeStatus.FAILED:
        return Outcome.done()  # gone, or already recorded (a late success)
    rail = get_rail(row.rail)
    if rail is None:
        raise ConfigurationError(f"charge {row.id}: rail {row.rail!r} is no longer configured")
    try:
        answer, _ = rail_calls.void(row.id, rail, share=worker_share(ctx.worker_concurrency))
    except RailDeferred as exc:
        if ctx.deferrals_left > 0:
            return Outcome.defer(exc.delay_after(ctx.deferrals), str(exc))
        raise RailUnavailable(f"{exc}; deferral ceiling reached") from exc
    # RailUnavailable (a refused resend included) and RailRejected propagate: the job's
    # retries, then a dead letter naming the charge. Nothing is written: the charge stays failed.
    if answer.status is RailStatus.SUCCEEDED:
        said = answer.amount_captured or 0  # believed within the charge's amount
        capture_transitions.late_success(
            row, said if 0 < said <= row.amount else row.amount, sources=[ChargeStatus.FAILED]
        )
        return Outcome.done()
    if answer.status in (RailStatus.CANCELED, RailStatus.FAILED, RailStatus.NOT_FOUND):
        logger.info("failed charge voided at its rail", extra={"charge_id": row.id, "rail_status": answer.status.value})
        return Outcome.done()
    raise RailUnavailable(f"rail {row.rail}: the void of {row.id} was answered {answer.status.value}, not final")
