"""A status read's answer recorded in the transaction that settles its charge, and its slot
of the rail's ceiling handed over to the next status read in that same transaction.

A settled poll used to cost three commits: its request row (committed before the GET, which
stays), the answer, then the settlement. Now the answer rides in the settlement's
transaction, and where a batch has a next charge to ask about (``poll_batch``), so does
that charge's request row, written in the answered request's slot of the rail's ceiling
(``request_log.hand_over_slot``): one commit per carried charge, and no wait for the rail's
lock, which serialized the fleet's request rows (bench/CHARGES.md).

What a failure leaves is what it left before. The transaction rolls back whole: the charge
is not settled and, where it was to be, the next row is not written (its request is not
sent, and the ceiling admits it, if anything does). The answer is then recorded on its own,
so the row is evidence of it and the slot frees now rather than at the bound, and the
error is raised. A crash before the commit leaves the row unanswered, as a crash between
the answer and its record always did: the poll's job runs again and asks again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import transaction

from charges import request_log
from charges.rails import RailConfig
from charges.rails.adapter import RailAnswer
from charges.services import rail_slots
from charges.services.rail_calls import record_answer, status_path
from vpay.errors import error_chain

logger = logging.getLogger(__name__)

T = TypeVar("T")


def settle_with_answer(
    request_id: int,
    answer: RailAnswer,
    rail: RailConfig,
    settle: Callable[[], T],
    *,
    next_charge_id: str | None = None,
    hand_over_by: float = math.inf,
) -> tuple[T, int | None]:
    """``settle()`` (the poll's settlement table) and the answer's record, one transaction
    (durable: the next request's row must be committed before it is sent); with
    ``next_charge_id``, the slot handed over to that charge's status read if the settlement
    ended by ``hand_over_by`` (``time.monotonic()``: the batch's hold, which a settlement
    waiting on locks could otherwise outlast). Returns what ``settle`` returned and the next
    read's request row (committed), or None."""
    handed: int | None = None
    try:
        with transaction.atomic(durable=True):
            settled = settle()
            if next_charge_id is None or time.monotonic() > hand_over_by:
                record_answer(request_id, answer)
            else:
                handed = request_log.hand_over_slot(
                    request_id,
                    status_code=answer.http_status,
                    rail_status=answer.status,
                    excerpt=answer.body_excerpt,
                    charge_id=next_charge_id,
                    rail=rail.code,
                    path=status_path(next_charge_id),
                    within_seconds=settings.VPAY_RAIL_TIMEOUT_SECONDS,
                )
    except Exception as exc:
        if handed is not None:
            # The commit may have happened (an on-commit callback raised, or the connection
            # dropped with the COMMIT in flight): the row handed over will not be sent.
            _not_sent(handed, exc)
        _record_alone(request_id, answer)
        rail_slots.slot_freed(rail.code)
        raise
    if handed is None:
        rail_slots.slot_freed(rail.code)  # answered: the slot is free in provider_requests too
    return settled, handed


def _record_alone(request_id: int, answer: RailAnswer) -> None:
    try:
        record_answer(request_id, answer)
    except Exception:
        logger.warning("could not record a rail's answer; its slot frees at the bound", exc_info=True)


def _not_sent(request_id: int, exc: Exception) -> None:
    """A row handed over whose request will not go out, closed (it matches nothing if the
    transaction that wrote it rolled back): no slot held, no request claimed."""
    try:
        request_log.record_answer(
            request_id,
            status_code=None,
            error=f"not sent: the transaction that wrote it failed ({error_chain(exc, 300)})",
        )
    except Exception:
        logger.warning("could not close a request row that was not sent; its slot frees at the bound", exc_info=True)
