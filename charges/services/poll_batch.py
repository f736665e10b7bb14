"""Polls batched per rail: a poll that asks the rail carries the merchant's other due polls
on the same rail with it.

A backlog of due polls used to cost a job run per charge: a claim, a settle, a read of the
charge, a read of the rail's breaker. Now a poll of a ``submitted`` charge takes up to
``VPAY_RAIL_POLL_BATCH - 1`` more:

1. :func:`start`, before its own request: picks the merchant's due polls of ``submitted``
   charges on the same rail (a bounded walk of the claim's own index), *holds* their jobs
   (``jobs.port.hold_waiting``: each waits until the hold ends, not leased, no attempt
   counted), reads their charges in one statement, and asks the rail's breaker once (a
   closed breaker only: a half-open one's probe goes alone). A charge that moved meanwhile
   or is past its horizon is given back (its job made due at once, to run on its own).
2. The carrier makes its own request, as it always has.
3. :func:`finish`: then each carried charge in turn, exactly as a lone poll asks: its status
   request row written within the rail's ceiling and committed, the GET, the answer (or
   error) recorded on the row and told to the breaker (``rail_calls.finish_status``), then
   the poll's own settlement table and ladder (``polling.after_answer``). Each held job is
   then settled as its own run would have been (``jobs.port.settle_held``): finished, or
   due at its next rung. Once the ceiling is full, the rest are given back.

One after another, not at once: a batch holds one slot of the rail's ceiling
(``VPAY_RAIL_MAX_IN_FLIGHT``, 8 across the fleet) at a time, as the lone poll did, so a few
carriers never fill the ceiling and leave every other executor deferring on it (measured:
sent at once, eight at a time, the worker settled a third of what it did before). What a
batch saves is the job runs around the requests, not the requests' own time.

A crash anywhere costs a carried poll what it costs a lone one: its job runs when the hold
ends, and its request row (answered or not) is the evidence the usual recovery reads. The
in-process queue holds nothing, so there each poll goes on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from charges import poll_batch_repository, repository
from charges.ladder import past_the_horizon
from charges.policy import RecoveryPolicy
from charges.rails import RailConfig
from charges.rails.adapter import RailAnswer, RailError, RailRejected, RailUnavailable, adapter_for
from charges.repository import ChargeRow
from charges.services import rail_calls, rail_gate
from charges.services.rail_gate import RailDeferred
from charges.states import ChargeStatus, RailStatus
from jobs import port as queue
from jobs.primitives.breakers import Ticket
from jobs.runner.outcome import Action, Outcome
from vpay.errors import error_chain

logger = logging.getLogger("charges.services.polling")

# How far into a merchant's ready jobs the batch looks for polls (charges.poll_batch_repository).
WALK = 64
# A carried poll is held for the rail call's bound and this much more (the poll job's own
# lease is the timeout + 30 s too): if the carrier dies, its carried polls run on their own then.
HOLD_MARGIN_SECONDS = 30.0


@dataclass
class Batch:
    rail: RailConfig
    ticket: Ticket
    rows: list[ChargeRow]  # held, to be asked about after the carrier's own request


def start(row: ChargeRow, rail: RailConfig, policy: RecoveryPolicy) -> Batch | None:
    """Step 1 up to the requests (see the module docstring): the polls held, their charges
    read, the breaker asked; None when there is nothing to carry (all given back)."""
    room = settings.VPAY_RAIL_POLL_BATCH - 1
    if room < 1 or not queue.adapter().durable:
        return None
    ids = poll_batch_repository.due_polls_beside(row.merchant_id, rail.code, row.id, room, WALK)
    if not ids:
        return None
    names = {repository.poll_dedupe_key(charge_id): charge_id for charge_id in ids}
    held = [names[name] for name in queue.hold_waiting(list(names), _hold_seconds())]
    if not held:
        return None
    rows = repository.read_many_for_poll(held)
    plain = [
        rows[charge_id]
        for charge_id in held
        if charge_id in rows
        and rows[charge_id].status == ChargeStatus.SUBMITTED
        and not past_the_horizon(rows[charge_id].age, policy)
    ]
    ticket = _closed_ticket(rail.code) if plain else None
    if ticket is None:
        _give_back(held)
        return None
    _give_back([charge_id for charge_id in held if charge_id not in {r.id for r in plain}])
    return Batch(rail, ticket, plain)


def start_safely(row: ChargeRow, rail: RailConfig, policy: RecoveryPolicy) -> Batch | None:
    """:func:`start`, which is only ever a saving: if it fails, the poll goes on alone (a
    held job it did not carry runs when its hold ends)."""
    try:
        return start(row, rail, policy)
    except Exception:
        logger.warning("could not carry the merchant's other due polls; this one goes alone", exc_info=True)
        return None


def finish(batch: Batch, policy: RecoveryPolicy, after_answer: Callable[..., Outcome]) -> None:
    """Step 3 (see the module docstring)."""
    settles: list[tuple[str, float | None]] = []
    given_back: list[str] = []
    for index, row in enumerate(batch.rows):
        try:
            request_id = rail_calls.record_status_sent(row.id, batch.rail, batch.ticket)
        except Exception as exc:
            if not isinstance(exc, RailDeferred):  # the ceiling is full: the rest go on their own
                logger.warning("could not ask about a carried poll; the rest go on their own", exc_info=True)
            given_back.extend(r.id for r in batch.rows[index:])
            break
        try:
            status, failure_code, pay_token, retry_after = _answer(request_id, row, batch)
            outcome = after_answer(
                row, status, failure_code, pay_token, retry_after=retry_after, past=False, policy=policy
            )
        except Exception:
            logger.exception("a carried poll failed; its job runs on its own", extra={"charge_id": row.id})
            given_back.append(row.id)
            continue
        if outcome.action is Action.DONE:
            settles.append((repository.poll_dedupe_key(row.id), None))
        elif outcome.action is Action.RESCHEDULE:
            settles.append((repository.poll_dedupe_key(row.id), outcome.delay))
        else:
            given_back.append(row.id)  # not a plain next rung: its own run decides
    try:
        queue.settle_held(settles)
    except Exception:
        logger.warning("could not settle carried polls; each runs when its hold ends", exc_info=True)
    _give_back(given_back)


def _answer(request_id: int, row: ChargeRow, batch: Batch) -> tuple[RailStatus, str | None, str | None, float]:
    """The carried GET's answer as the poll reads one: (status, failure code, pay token,
    the rail's Retry-After), ``UNAVAILABLE`` for a non-answer (a refusal of a status read
    included, as for a lone poll before its horizon). A configuration error is raised: its
    own run dead-letters it."""
    try:
        answer = rail_calls.finish_status(request_id, batch.rail, batch.ticket, _get(batch.rail, row))
    except RailUnavailable as exc:
        logger.warning("rail did not answer a poll", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        return RailStatus.UNAVAILABLE, None, None, exc.retry_after or 0.0
    except RailRejected as exc:
        logger.warning("rail refused a poll", extra={"charge_id": row.id, "error": error_chain(exc, 300)})
        return RailStatus.UNAVAILABLE, None, None, 0.0
    return answer.status, answer.failure_code, answer.pay_token, 0.0


def _get(rail: RailConfig, row: ChargeRow) -> RailAnswer | RailError:
    """The GET alone, its error returned, not raised (``finish_status`` records either)."""
    try:
        return adapter_for(rail).status(reference=row.id, pay_token=row.pay_token)
    except RailError as exc:
        return exc


def _closed_ticket(rail_code: str) -> Ticket | None:
    """The rail's breaker ticket for the batch, only while the breaker is closed."""
    try:
        ticket = rail_gate.admit(rail_code)
    except RailDeferred:
        return None
    if ticket.probe:
        rail_gate.abandoned(ticket)  # the probe goes alone: hand its turn back
        return None
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
    return settings.VPAY_RAIL_TIMEOUT_SECONDS + HOLD_MARGIN_SECONDS
