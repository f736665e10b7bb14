"""Deliveries batched per endpoint: a deliver job that has begun its own attempt carries the
endpoint's other due deliveries with it.

A backlog to one endpoint used to cost a job run per delivery (a claim, a settle, the
handler's three steps); now one run starts up to ``VPAY_WEBHOOK_BATCH`` attempts to the
endpoint in one transaction, sends them at once, and records their outcomes in one
statement. Each attempt keeps its own attempt row, lease token and fence, exactly as a lone
one (``webhooks.services.delivery``):

1. :func:`carry` — one transaction under the endpoint's row lock: count its live leases
   (the per-endpoint cap holds for the batch as for any attempt), lock the endpoint's due
   ``pending`` deliveries beside the carrier's own (SKIP LOCKED), *hold* their deliver jobs
   (``jobs.port.hold_waiting``: each job waits until its attempt's lease has ended, not run,
   not counted), and start the attempts of the ones whose jobs were held. It commits before
   anything is sent, so every request that leaves has its row.
2. :func:`start_batch` — each carried attempt sent on a thread of a per-process pool, while
   the carrier's own is (a slow receiver's batch takes one timeout, not one per delivery).
3. :func:`finish_batch` — the carried outcomes recorded together (``delivery.record_many``:
   fenced on each lease), apart from the carrier's own (recorded through its group commit
   whatever becomes of the batch); then each carried job settled as its own run would have
   been (``jobs.port.settle_held``): finished, or due at its delivery's next rung. A carried
   attempt whose record was stale leaves its job alone: its hold ends with the lease.

A crash, or an error in the batch's steps, costs a carried delivery what a crash costs a lone
one: its attempt's lease expires, its held job runs when the hold ends (just after the
lease), and the usual recovery abandons the attempt (a rung) and sends it again. Only the
endpoint's deliveries that are due are carried, only while the endpoint is live, and only
on a breaker that is closed (a half-open breaker's probe goes alone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from jobs import port
from vpay import faultpoints
from vpay.send_pool import SendPool
from webhooks import attempt_batch_sql, attempt_sql
from webhooks.decisions import delivery_delay
from webhooks.models import AttemptState, DeliveryState
from webhooks.services import delivery
from webhooks.services.sending import Attempted, perform

logger = logging.getLogger("webhooks.delivery")

# A carried job is held until its attempt's lease has ended, and this much after, so its own
# run (if the carrier died) finds the lease expired and recovers it at once.
HOLD_MARGIN_SECONDS = 1.0
# How long a carrier goes on carrying its endpoint's next full batches (carry_on).
ROUNDS_SECONDS = 0.25


def carry(lease: attempt_sql.Lease, *, alone: bool = False) -> tuple[list[attempt_sql.Lease], port.Held | None]:
    """Step 1: begin attempts of up to ``VPAY_WEBHOOK_BATCH - 1`` other due deliveries of
    ``lease``'s endpoint (``VPAY_WEBHOOK_BATCH`` once the carrier's own is recorded:
    ``alone``), holding their jobs; their leases, in the order begun, and the hold. None
    where the queue cannot hold jobs for another (the in-process adapter)."""
    room = settings.VPAY_WEBHOOK_BATCH - (0 if alone else 1)
    if room < 1 or not port.adapter().durable:
        return [], None
    lease_seconds = settings.VPAY_WEBHOOK_LEASE_SECONDS
    with transaction.atomic():
        in_flight, _, _ = attempt_batch_sql.in_flight_for_endpoints([lease.endpoint_id])[lease.endpoint_id]
        room = min(room, settings.VPAY_WEBHOOK_MAX_IN_FLIGHT - in_flight)
        if room < 1:
            return [], None
        ids = attempt_batch_sql.lock_due_beside(lease.endpoint_id, lease.delivery_id, room)
        if not ids:
            return [], None
        names = {delivery.dedupe_key(delivery_id): delivery_id for delivery_id in ids}
        held = port.hold_waiting(list(names), lease_seconds + HOLD_MARGIN_SECONDS)
        if not held.names:
            return [], None
        begun = [names[name] for name in held.names]
        leases = attempt_batch_sql.start_attempts(begun, lease_seconds)
    return [leases[delivery_id] for delivery_id in begun], held


def carry_safely(lease: attempt_sql.Lease, *, alone: bool = False) -> tuple[list[attempt_sql.Lease], port.Held | None]:
    """:func:`carry`, which is only ever a saving: if it fails (its transaction rolled
    back, nothing begun), the carrier's own attempt goes on alone."""
    try:
        return carry(lease, alone=alone)
    except Exception:
        logger.warning("could not carry the endpoint's other due deliveries; this one goes alone", exc_info=True)
        return [], None


SENDERS = SendPool("webhook-send")


def start_send(lease: attempt_sql.Lease, loaded: attempt_sql.Loaded | None, concurrency: int | None) -> Future:
    """Step 2 for one attempt, on a send thread. ``loaded`` is always given, so the send
    reads nothing (``None``: the delivery is gone, and nothing is sent)."""
    if loaded is None:
        done: Future = Future()
        done.set_result(Attempted(AttemptState.FAILED, error="the delivery is gone; nothing sent"))
        return done
    # Enough threads for every executor's batch at once.
    return SENDERS.submit(max(concurrency or 1, 1) * settings.VPAY_WEBHOOK_BATCH, perform, lease, loaded=loaded)


@dataclass
class Batch:
    """A batch begun beside a carrier's own attempt: the carried leases and their sends."""

    leases: list[attempt_sql.Lease]
    sends: list[Future]
    held: port.Held


def start_batch(lease: attempt_sql.Lease, concurrency: int | None, *, alone: bool = False) -> Batch | None:
    """Steps 1 and 2: the batch begun (:func:`carry`), what its attempts send read in one
    statement, and each sent on a send thread. None when nothing was carried. Never raises:
    an attempt begun and not sent is left to its lease, as a crash would leave it."""
    leases, held = carry_safely(lease, alone=alone)
    if not leases or held is None:
        return None
    faultpoints.reached("webhook.carried")
    sends: list[Future] = []
    try:
        loaded = attempt_batch_sql.load_deliveries([one.delivery_id for one in leases])
        for one in leases:
            sends.append(start_send(one, loaded.get(one.delivery_id), concurrency))
    except Exception:
        logger.warning("could not send a carried batch; its unsent attempts are left to their leases", exc_info=True)
    return Batch(leases[: len(sends)], sends, held)


def finish_batch(batch: Batch) -> list[Attempted]:
    """Step 3: the carried answers recorded in one statement, then their jobs settled; the
    answers recorded (for the host's breaker). Never raises: an attempt whose answer cannot
    be recorded is left to its lease (abandoned, and sent again, as after a crash), with the
    reason logged."""
    answered: list[tuple[attempt_sql.Lease, Attempted]] = []
    for lease, send in zip(batch.leases, batch.sends, strict=True):
        try:
            answered.append((lease, send.result()))
        except Exception:
            logger.exception(
                "a carried webhook attempt failed; it is left to its lease", extra={"delivery_id": lease.delivery_id}
            )
    if not answered:
        return []
    try:
        recorded = delivery.record_many(answered)
    except Exception:
        logger.exception("could not record a carried batch; its attempts are left to their leases")
        return []
    settle_carried([lease for lease, _ in answered], recorded, batch.held)
    return [attempted for _, attempted in answered]


def carry_on(
    lease: attempt_sql.Lease, first: Batch, answers: list[Attempted], concurrency: int | None
) -> list[Attempted]:
    """After a full batch that every receiver answered with a success, the carrier carries
    the endpoint's next due batch, and so on while each is full and answered so, for at most
    :data:`ROUNDS_SECONDS`: the backlog of one endpoint no longer pays a job run (a claim, a
    settle, the carrier's own steps) per batch. Bounded, so the executor goes back to the
    claim's round-robin soon; and no request follows a failure on the breaker's old ticket.
    Every answer, for the host's breaker."""
    began = time.monotonic()
    everything = list(answers)
    full = settings.VPAY_WEBHOOK_BATCH - 1
    while (
        len(first.leases) >= full
        and answers
        and all(one.attempt_state == AttemptState.SUCCEEDED for one in answers)
        and time.monotonic() - began < ROUNDS_SECONDS
    ):
        batch = start_batch(lease, concurrency, alone=True)
        if batch is None:
            break
        first, full = batch, settings.VPAY_WEBHOOK_BATCH
        answers = finish_batch(batch)
        everything += answers
    return everything


def settle_carried(
    leases: Sequence[attempt_sql.Lease], recorded: Sequence[attempt_sql.Recorded], held: port.Held
) -> None:
    """Step 3's end: each carried job finished, or due at its delivery's next rung, as its
    own run would have left it (a stale record leaves the job to its hold). Bookkeeping: a
    failure here leaves the jobs held, and each runs when its hold ends and finds its delivery
    recorded."""
    settles: list[tuple[str, float | None]] = []
    for lease, one in zip(leases, recorded, strict=True):
        if one.stale:
            continue
        if one.delivery_state == DeliveryState.PENDING:
            delay = delivery_delay(lease.rung, settings.VPAY_WEBHOOK_RETRY_SCHEDULE)
            settles.append((delivery.dedupe_key(lease.delivery_id), delay or 0.0))
        else:
            settles.append((delivery.dedupe_key(lease.delivery_id), None))
    try:
        port.settle_held(settles, held)
    except Exception:
        logger.warning("could not settle carried deliver jobs; each runs when its hold ends", exc_info=True)
