"""Polls batched per rail: a poll that asks the rail carries the merchant's other due polls
on the same rail with it.

A backlog of due polls used to cost a job run per charge: a claim, a settle, a read of the
charge, a read of the rail's breaker. Now a poll of a ``submitted`` charge takes up to
``VPAY_RAIL_POLL_BATCH - 1`` more:

1. :func:`start`, before its own request: picks the merchant's due polls of ``submitted``
   charges on the same rail (a bounded walk of the claim's own index), *holds* their jobs
   (``jobs.port.hold_waiting``: each waits until the hold ends, not leased, no attempt
   counted) and reads their charges in one statement. A charge that moved meanwhile, or is
   within the hold of its horizon, is given back (its job made due at once, to run on its own).
2. The carrier makes its own request, as it always has. If the rail's guards defer it, the
   whole batch is given back (:func:`give_back_all`).
3. :func:`finish`: then each carried charge in turn, as a lone poll asks (its request row
   committed before the GET, the answer or error told to the breaker and recorded on it),
   on one ticket of the rail's breaker taken for the batch (a closed breaker's: a half-open
   one's probe goes alone) and on the carrier's executor, whose own request this worker's
   share counted, then the poll's own settlement table and ladder (``polling.after_answer``).
   Each held job is then settled as its own run would have been (``jobs.port.settle_held``):
   finished, or due at its next rung. The first non-answer (no answer, a refusal) or guard
   that defers ends the batch: that poll and the rest are given back, so no request goes
   out on a breaker read from before a failure, and neither does one that could outlast
   the hold.

Each answer hands its slot of the ceiling to the next charge's request in the transaction
that settles it (``status_answers``; the carrier's own answer to the first).

One after another, not at once: a batch holds one slot of the rail's ceiling
(``VPAY_RAIL_MAX_IN_FLIGHT``, 8 across the fleet) at a time, as the lone poll did, so a few
carriers never fill the ceiling and leave every other executor deferring on it (measured:
sent at once, eight at a time, the worker settled a third of what it did before). What a
batch saves is the job runs around the requests (the claims, the settles, the reads of
each charge), not the requests' own time.

A crash anywhere costs a carried poll what it costs a lone one: its job runs when the hold
ends, and its request row (answered or not) is the evidence the usual recovery reads. The
in-process queue holds nothing, so there each poll goes on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.conf import settings

from charges import poll_batch_repository, repository
from charges.ladder import past_the_horizon
from charges.policy import RecoveryPolicy
from charges.rails import RailConfig
from charges.rails.adapter import RailAnswer, RailRejected, RailUnavailable
from charges.repository import ChargeRow
from charges.services import rail_calls, rail_gate, status_answers
from charges.services.rail_gate import RailDeferred
from charges.states import ChargeStatus, RailStatus
from jobs import port as queue
from jobs.primitives.breakers import Ticket
from jobs.runner.outcome import Action, Outcome
from vpay.errors import error_chain

logger = logging.getLogger("charges.services.polling")

# How far into a merchant's ready jobs the batch looks for polls (charges.poll_batch_repository):
# a few batches' worth, so a merchant whose due jobs are mostly deliveries costs a short scan.
WALK = 64
# A carried poll is held for two rail calls' bound and this much more (50 s with the
# default 20 s timeout): long enough for the carrier's own request and at least one of the
# batch's on a rail at its timeout (a carried request is only sent while it would end within
# the hold, ASK_MARGIN_SECONDS to spare), and the whole batch on a rail that answers; short
# enough that a dead carrier's batch runs on its own within a minute.
HOLD_MARGIN_SECONDS = 10.0
ASK_MARGIN_SECONDS = 5.0
# A batch sends no request after this long: the rest go back to their own jobs, which other
# executors run beside it. Its requests are serial, so on a slow rail its last charges would
# otherwise wait for all the others (16 at 300 ms: 4.8 s); on a fast one 16 take tens of ms.
BATCH_SECONDS = 1.0


@dataclass
class Batch:
    rail: RailConfig
    held: queue.Held
    rows: list[ChargeRow]  # held, to be asked about after the carrier's own request
    ticket: Ticket | None = None  # the rail breaker's, asked once for the batch
    handed: int | None = None  # the first row's request row, written by the carrier's answer


def start(row: ChargeRow, rail: RailConfig, policy: RecoveryPolicy) -> Batch | None:
    """Step 1 (see the module docstring): the polls held and their charges read; None when
    there is nothing to carry (all given back)."""
    room = settings.VPAY_RAIL_POLL_BATCH - 1
    if room < 1 or not queue.adapter().durable:
        return None
    ids = poll_batch_repository.due_polls_beside(row.merchant_id, rail.code, row.id, room, WALK)
    if not ids:
        return None
    names = {repository.poll_dedupe_key(charge_id): charge_id for charge_id in ids}
    hold = queue.hold_waiting(list(names), _hold_seconds())
    held = [names[name] for name in hold.names]
    if not held:
        return None
    rows = repository.read_many_for_poll(held)
    # A charge that moved meanwhile is its own poll's to look at; one near its horizon too
    # (judged against the read's age plus the hold, the longest the batch can take), as each
    # poll past it escalates alone.
    plain = [
        rows[charge_id]
        for charge_id in held
        if charge_id in rows
        and rows[charge_id].status == ChargeStatus.SUBMITTED
        and not past_the_horizon(rows[charge_id].age + _hold_seconds(), policy)
    ]
    _give_back([charge_id for charge_id in held if charge_id not in {r.id for r in plain}])
    return Batch(rail, hold, plain) if plain else None


def start_safely(row: ChargeRow, rail: RailConfig, policy: RecoveryPolicy) -> Batch | None:
    """:func:`start`, which is only ever a saving: if it fails, the poll goes on alone (a
    held job it did not carry runs when its hold ends)."""
    try:
        return start(row, rail, policy)
    except Exception:
        logger.warning("could not carry the merchant's other due polls; this one goes alone", exc_info=True)
        return None


def finish(batch: Batch, policy: RecoveryPolicy, after_answer: Callable[..., Outcome], *, started: float) -> None:
    """Step 3 (see the module docstring). ``started``: when the carrier began (monotonic), so
    no carried request is sent that could outlast its poll's hold."""
    settles: list[tuple[str, float | None]] = []
    given_back: list[str] = []
    # Not counted in this worker's share of the rail: the requests run one after another on
    # the executor whose own request it counted, and the first one unanswered ends the batch,
    # so a hung rail holds a carrier for one more timeout at most. Counted, each refused
    # request (two executors of four already in a request) ended the batch early, and the
    # churn cost it all its gain; a share slot held for the whole batch deferred the other
    # executors' polls for seconds (bench/CHARGES.md).
    _ask_each(batch, policy, after_answer, started, settles, given_back)
    try:
        queue.settle_held(settles, batch.held)
    except Exception:
        logger.warning("could not settle carried polls; each runs when its hold ends", exc_info=True)
    _give_back(given_back)


def _ask_each(
    batch: Batch,
    policy: RecoveryPolicy,
    after_answer: Callable[..., Outcome],
    started: float,
    settles: list[tuple[str, float | None]],
    given_back: list[str],
) -> None:
    """:func:`finish`'s requests, one after another, into ``settles`` and ``given_back``."""
    handed = batch.handed  # the request row the previous answer's transaction wrote
    for index, row in enumerate(batch.rows):
        if handed is None and not in_time(started):
            given_back.extend(r.id for r in batch.rows[index:])  # past the batch's time (above)
            break
        # The first non-answer ends the batch (after this poll's own next rung, as a lone
        # poll's): no request goes out on a breaker read from before a failure.
        last = False
        retry_after = 0.0
        sent: tuple[int, RailAnswer] | None = None
        try:
            if batch.ticket is None:
                batch.ticket = _closed_ticket(batch.rail.code)
            sent = rail_calls.status_unrecorded(
                row.id, batch.rail, pay_token=row.pay_token, ticket=batch.ticket, carried=True, request_id=handed
            )
            status, failure_code, pay_token = sent[1].status, sent[1].failure_code, sent[1].pay_token
        except RailDeferred:
            given_back.extend(r.id for r in batch.rows[index:])  # a guard held it back: nothing sent
            break
        except (RailUnavailable, RailRejected) as exc:
            logger.warning("rail did not answer a poll", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
            status, failure_code, pay_token, last = RailStatus.UNAVAILABLE, None, None, True
            retry_after = (exc.retry_after or 0.0) if isinstance(exc, RailUnavailable) else 0.0
        except Exception:
            logger.exception("a carried poll failed; it and the rest run on their own", extra={"charge_id": row.id})
            given_back.extend(r.id for r in batch.rows[index:])
            break
        handed = None
        settle = partial(
            after_answer, row, status, failure_code, pay_token, retry_after=retry_after, past=False, policy=policy
        )
        try:
            if sent is None:  # a non-answer, recorded already
                outcome = settle()
            else:
                following = next_to_ask(batch, index + 1, started)
                outcome, handed = status_answers.settle_with_answer(
                    sent[0], sent[1], batch.rail, settle, next_charge_id=following, hand_over_by=ask_deadline(started)
                )
        except Exception:
            logger.exception("a carried poll failed; its job runs on its own", extra={"charge_id": row.id})
            outcome = Outcome.defer(0, "")  # given back below
        if outcome.action is Action.DONE:
            settles.append((repository.poll_dedupe_key(row.id), None))
        elif outcome.action is Action.RESCHEDULE:
            settles.append((repository.poll_dedupe_key(row.id), outcome.delay))
        else:
            given_back.append(row.id)  # not a plain next rung: its own run decides
        if last:
            given_back.extend(r.id for r in batch.rows[index + 1 :])
            break


def next_to_ask(batch: Batch | None, index: int, started: float) -> str | None:
    """The charge whose request the answer in hand hands its slot to: the batch's
    ``index``-th, if there is one, its request would end within the hold, and the batch has
    its breaker ticket (taken here, before its row is written: a row handed over is sent)."""
    if batch is None or index >= len(batch.rows) or not in_time(started):
        return None
    if batch.ticket is None:
        try:
            batch.ticket = _closed_ticket(batch.rail.code)
        except Exception:  # asked again before the request, where a refusal gives the batch back
            logger.warning("could not take the breaker's ticket for a batch", exc_info=True)
            return None
    return batch.rows[index].id


def in_time(started: float) -> bool:
    """Whether one more request may be sent now (:func:`ask_deadline`)."""
    return time.monotonic() <= ask_deadline(started)


def ask_deadline(started: float) -> float:
    """The last ``time.monotonic()`` at which a request of the batch begun at ``started`` may
    be sent: within ``BATCH_SECONDS``, and so that it ends within the hold,
    ``ASK_MARGIN_SECONDS`` to spare."""
    return started + min(BATCH_SECONDS, _hold_seconds() - settings.VPAY_RAIL_TIMEOUT_SECONDS - ASK_MARGIN_SECONDS)


def give_back_all(batch: Batch) -> None:
    """The carrier's own request was not made (the rail's guards deferred it): neither is
    any of the batch's; every held poll runs on its own."""
    _give_back([row.id for row in batch.rows])
    batch.rows = []


def _closed_ticket(rail_code: str) -> Ticket:
    """The rail breaker's ticket for the batch's requests, while it is closed: a half-open
    breaker's probe goes alone (its turn is handed back and the batch deferred)."""
    ticket = rail_gate.admit(rail_code)
    if ticket.probe:
        raise rail_gate.at_ceiling(rail_code, ticket, None, "is probing: a probe goes alone")
    return ticket


def _give_back(charge_ids: list[str]) -> None:
    """Held polls this batch will not carry: due at once, to run on their own."""
    if not charge_ids:
        return
    try:
        names = [repository.poll_dedupe_key(charge_id) for charge_id in charge_ids]
        queue.pull_forward_waiting(names, len(names))
    except Exception:
        logger.warning("could not give carried polls back; each runs when its hold ends", exc_info=True)


def _hold_seconds() -> float:
    return 2 * settings.VPAY_RAIL_TIMEOUT_SECONDS + HOLD_MARGIN_SECONDS
