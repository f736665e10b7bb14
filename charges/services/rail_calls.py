"""Rail calls with their evidence: each request is recorded (and committed) before it is
sent, and answered after, whatever happened — the row crash recovery reads.

Before the row is written the rail's guards are asked (``rail_gate``: its breaker, this
worker's share, the ceiling of requests in flight); a request they refuse is never sent,
leaves no row, and raises ``rail_gate.RailDeferred``. Every result then reaches the
breaker: ``RailUnavailable`` is a transient failure, any other outcome an answer.

Whether a submit is a resend (a submit of the same reference went out before) is decided
by the statement that records it (``request_log.record_sent_within_ceiling``), never by a
read taken before: a refusal of a resend proves nothing (the earlier send may have landed,
and the rail refuses the repeated reference), so it is raised as :class:`ResendRefused`, a
non-answer, and never as the ``RailRejected`` that fails a charge or a refund.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from django.conf import settings

from charges import request_log
from charges.metrics import RAIL_REQUESTS
from charges.models import RequestOperation
from charges.rails import RailConfig
from charges.rails.adapter import (
    RailAnswer,
    RailError,
    RailRejected,
    RailUnavailable,
    adapter_for,
    capture_key,
    void_key,
)
from charges.services import rail_gate, rail_slots
from charges.services.rail_gate import SHARES, RailDeferred
from jobs.primitives.breakers import Ticket
from vpay import faultpoints
from vpay.errors import error_chain

# A request unanswered this long after the rail timeout is a crashed worker's: it no longer
# holds a slot of the ceiling.
IN_FLIGHT_MARGIN_SECONDS = 5.0

__all__ = [
    "RailDeferred",
    "ResendRefused",
    "capture",
    "record_answer",
    "refund_status",
    "refund_submit",
    "status",
    "status_path",
    "status_unrecorded",
    "submit",
    "void",
]


class ResendRefused(RailUnavailable):
    """A refusing 4xx to a resend: no answer about the money, whatever it says ("duplicate
    reference", "already refunded"). Transient, so every caller treats it as a non-answer."""


def _resend_refused(exc: RailRejected) -> ResendRefused:
    refused = ResendRefused(f"{exc} to a resend (the reference went out before): proves nothing")
    refused.http_status, refused.body_excerpt = exc.http_status, exc.body_excerpt
    return refused


def submit(
    charge_id: str,
    rail: RailConfig,
    *,
    amount: int,
    currency: str,
    ticket: Ticket | None = None,
    ceiling: bool = True,
    share: int | None = None,
    capture: bool = True,
) -> tuple[int, RailAnswer]:
    """POST the charge (``capture=False``: an authorization). Returns the request row's id and
    the answer, which the caller records (``record_answer``) in the transaction that
    acts on it; a failure is recorded here, then re-raised.

    ``ticket``: the breaker's, when the caller asked it already (the confirm, before it
    wrote anything). ``ceiling=False``: the confirm's request counts as in flight but is
    not refused by the ceiling (see confirm.py). ``share``: this worker's share of threads.
    A refusal of a resend raises :class:`ResendRefused`."""
    request_id, answer, _ = _call(
        charge_id,
        rail,
        RequestOperation.SUBMIT,
        "POST",
        "/charges",
        charge_id,
        lambda: adapter_for(rail).submit(reference=charge_id, amount=amount, currency=currency, capture=capture),
        ticket=ticket,
        ceiling=ceiling,
        share=share,
        record=False,
    )
    return request_id, answer


def record_answer(request_id: int, answer: RailAnswer) -> None:
    request_log.record_answer(
        request_id, status_code=answer.http_status, rail_status=answer.status, excerpt=answer.body_excerpt
    )


def status(charge_id: str, rail: RailConfig, *, pay_token: str | None, share: int | None = None) -> RailAnswer:
    """GET the charge's status (404 is an answer: ``RailStatus.NOT_FOUND``), recorded on its
    own: for a caller that acts on it in a transaction of its own (a capture's or a void's
    poll). A poll records it with its settlement (:func:`status_unrecorded`)."""
    request_id, answer = status_unrecorded(charge_id, rail, pay_token=pay_token, share=share)
    record_answer(request_id, answer)
    rail_slots.slot_freed(rail.code)  # answered: the slot is free in provider_requests too
    return answer


def status_unrecorded(
    charge_id: str,
    rail: RailConfig,
    *,
    pay_token: str | None,
    share: int | None = None,
    ticket: Ticket | None = None,
    carried: bool = False,
    request_id: int | None = None,
) -> tuple[int, RailAnswer]:
    """GET the charge's status, its answer returned unrecorded with its request row's id: the caller
    records it in the transaction that settles the charge (``status_answers``), which frees
    the slot or hands it over. ``request_id``: the row written already, by the slot's hand-over
    from the previous answer (the ceiling not asked again). A rail's failure (``RailError``)
    is recorded here (and the slot freed), then raised; any other error leaves the row
    unanswered, as for every request."""
    return _call(
        charge_id,
        rail,
        RequestOperation.STATUS,
        "GET",
        status_path(charge_id),
        None,
        lambda: adapter_for(rail).status(reference=charge_id, pay_token=pay_token),
        ticket=ticket,
        ceiling=True,
        share=share,
        record=False,
        counted=not carried,
        request_id=request_id,
    )[:2]


def status_path(charge_id: str) -> str:
    """A status read's path as its request row keeps it: never the query, which carries the
    pay_token."""
    return f"/charges/{quote(charge_id, safe='')}"


def capture(
    charge_id: str, rail: RailConfig, *, amount: int, attempt: int = 0, share: int | None = None
) -> tuple[RailAnswer, bool]:
    """POST the capture of an authorized charge (idempotency key
    ``adapter.capture_key(charge, attempt)``), recorded; the second value says whether a
    capture went out for it before, since it was asked for (a resend, whose refusal raises
    :class:`ResendRefused`)."""
    key = capture_key(charge_id, attempt)
    _, answer, resend = _call(
        charge_id,
        rail,
        RequestOperation.CAPTURE,
        "POST",
        f"/charges/{quote(charge_id, safe='')}/capture",
        key,
        lambda: adapter_for(rail).capture(reference=charge_id, amount=amount, idempotency_key=key),
        ticket=None,
        ceiling=True,
        share=share,
        record=True,
    )
    return answer, resend


def void(charge_id: str, rail: RailConfig, *, share: int | None = None) -> tuple[RailAnswer, bool]:
    """POST the void of a charge's authorization (idempotency key ``<charge>:void``; 404 is
    an answer: the rail holds nothing), recorded; with whether it is a resend."""
    _, answer, resend = _call(
        charge_id,
        rail,
        RequestOperation.VOID,
        "POST",
        f"/charges/{quote(charge_id, safe='')}/void",
        void_key(charge_id),
        lambda: adapter_for(rail).void(reference=charge_id),
        ticket=None,
        ceiling=True,
        share=share,
        record=True,
    )
    return answer, resend


def refund_submit(
    refund_id: str, charge_id: str, rail: RailConfig, *, amount: int, currency: str, share: int | None = None
) -> tuple[int, RailAnswer, bool]:
    """POST the refund (its id is the reference and the Idempotency-Key). Like :func:`submit`,
    the answer is the caller's to record (``record_answer``); a failure is recorded
    here, and a refusal of a resend raises :class:`ResendRefused`. The third value says
    whether it was a resend, decided by the statement that recorded it."""
    return _call(
        charge_id,
        rail,
        RequestOperation.REFUND_SUBMIT,
        "POST",
        "/refunds",
        refund_id,
        lambda: adapter_for(rail).refund(
            reference=refund_id, charge_reference=charge_id, amount=amount, currency=currency
        ),
        ticket=None,
        ceiling=True,
        share=share,
        record=False,
        refund_id=refund_id,
    )


def refund_status(refund_id: str, charge_id: str, rail: RailConfig, *, share: int | None = None) -> RailAnswer:
    """GET the refund's status (404 is an answer: ``RailStatus.NOT_FOUND``), recorded."""
    _, answer, _ = _call(
        charge_id,
        rail,
        RequestOperation.REFUND_STATUS,
        "GET",
        f"/refunds/{quote(refund_id, safe='')}",
        None,
        lambda: adapter_for(rail).refund_status(reference=refund_id),
        ticket=None,
        ceiling=True,
        share=share,
        record=True,
        refund_id=refund_id,
    )
    return answer


def _call(
    charge_id: str,
    rail: RailConfig,
    operation: RequestOperation,
    method: str,
    path: str,
    idempotency_key: str | None,
    send: Callable[[], RailAnswer],
    *,
    ticket: Ticket | None,
    ceiling: bool,
    share: int | None,
    record: bool,
    refund_id: str | None = None,
    counted: bool = True,
    request_id: int | None = None,
) -> tuple[int, RailAnswer, bool]:
    """``request_id``: the request row, written already (a status read's: never a resend)."""
    ticket = ticket or rail_gate.admit(rail.code)
    if counted and not SHARES.acquire(rail.code, share):
        # This worker's own requests hold the share: their ends wake it, or its short wait does.
        raise rail_gate.at_ceiling(
            rail.code,
            ticket,
            None,
            f"holds this worker's share ({share}) of threads",
            soon=rail_slots.few_waiting(rail.code),
        )
    failed_recorded = False
    try:
        resend = False
        if request_id is None:
            request_id, resend = _record_sent(
                charge_id, rail, operation, method, path, idempotency_key, ticket, ceiling, refund_id
            )
        faultpoints.reached("rail.request_recorded", str(operation))
        try:
            answer = send()
        except RailError as exc:
            _record_error(request_id, exc)
            failed_recorded = True
            RAIL_REQUESTS.labels(
                rail=rail.code, operation=str(operation), result=str(exc.http_status or "no_answer")
            ).inc()
            if isinstance(exc, RailUnavailable):
                rail_gate.failed(ticket, error_chain(exc, 300))
            else:
                rail_gate.answered(ticket)  # a refusal is an answer: the rail is up
            if resend and isinstance(exc, RailRejected):
                raise _resend_refused(exc) from exc
            raise
        except BaseException:
            rail_gate.abandoned(ticket)  # our failure, not the rail's: a probe hands its turn back
            raise
    finally:
        if counted:
            SHARES.release(rail.code)
        if failed_recorded:
            rail_slots.slot_freed(rail.code)  # the failure is recorded: the slot is free everywhere
    faultpoints.reached("rail.answered", str(operation))
    RAIL_REQUESTS.labels(rail=rail.code, operation=str(operation), result=str(answer.http_status)).inc()
    if record:
        record_answer(request_id, answer)
    rail_gate.answered(ticket)
    if record:
        rail_slots.slot_freed(rail.code)  # answered: the slot is free in provider_requests too
    return request_id, answer, resend


def _record_sent(
    charge_id: str,
    rail: RailConfig,
    operation: RequestOperation,
    method: str,
    path: str,
    idempotency_key: str | None,
    ticket: Ticket,
    ceiling: bool,
    refund_id: str | None,
) -> tuple[int, bool]:
    """The request row's id, and whether it is a resend. Without the ceiling (the confirm's
    submit, the charge's first) the row is written as it is: nothing went out before it."""
    fields: dict[str, Any] = {
        "rail": rail.code,
        "method": method,
        "path": path,
        "idempotency_key": idempotency_key,
        "refund_id": refund_id,
    }
    if not ceiling:
        return request_log.record_sent(charge_id, operation, **fields), False
    bound = settings.VPAY_RAIL_TIMEOUT_SECONDS + IN_FLIGHT_MARGIN_SECONDS
    request_id, earliest_left, earlier = request_log.record_sent_within_ceiling(
        charge_id,
        operation,
        **fields,
        ceiling=settings.VPAY_RAIL_MAX_IN_FLIGHT,
        bound_seconds=bound,
    )
    if request_id is None:
        # The oldest request in flight went out bound - earliest_left ago.
        moving = earliest_left is not None and bound - earliest_left < rail_gate.MOVING_AGE_SECONDS
        raise rail_gate.at_ceiling(
            rail.code,
            ticket,
            earliest_left,
            f"has its ceiling ({settings.VPAY_RAIL_MAX_IN_FLIGHT}) in flight",
            soon=moving and rail_slots.few_waiting(rail.code),
        )
    return request_id, earlier


def _record_error(request_id: int, exc: RailError) -> None:
    # status_code NULL when nothing answered; the whole cause chain ("ConnectError <- OSError:
    # connection refused") is what an operator needs, redacted and bounded.
    request_log.record_answer(
        request_id, status_code=exc.http_status, error=error_chain(exc, 1500), excerpt=exc.body_excerpt
    )
