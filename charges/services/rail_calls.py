"""Rail calls with their evidence: each request is recorded (and committed) before it is
sent, and answered after, whatever happened — the row crash recovery reads."""

from __future__ import annotations

from urllib.parse import quote

from charges import repository
from charges.metrics import RAIL_REQUESTS
from charges.models import RequestOperation
from charges.rails import RailConfig
from charges.rails.adapter import RailAnswer, RailError, adapter_for
from vpay.errors import error_chain


def submit(charge_id: str, rail: RailConfig, *, amount: int, currency: str) -> tuple[int, RailAnswer]:
    """POST the charge. Returns the request row's id and the answer, which the caller records
    (``record_submit_answer``) in the transaction that acts on it; a failure is recorded
    here, then re-raised."""
    request_id = repository.record_sent(
        charge_id, RequestOperation.SUBMIT, rail=rail.code, method="POST", path="/charges", idempotency_key=charge_id
    )
    try:
        answer = adapter_for(rail).submit(reference=charge_id, amount=amount, currency=currency)
    except RailError as exc:
        _record_error(request_id, exc)
        RAIL_REQUESTS.labels(rail=rail.code, operation="submit", result=str(exc.http_status or "no_answer")).inc()
        raise
    RAIL_REQUESTS.labels(rail=rail.code, operation="submit", result=str(answer.http_status)).inc()
    return request_id, answer


def record_submit_answer(request_id: int, answer: RailAnswer) -> None:
    repository.record_answer(
        request_id, status_code=answer.http_status, rail_status=answer.status, excerpt=answer.body_excerpt
    )


def status(charge_id: str, rail: RailConfig, *, pay_token: str | None) -> RailAnswer:
    """GET the charge's status (404 is an answer: ``RailStatus.NOT_FOUND``), recorded."""
    request_id = repository.record_sent(
        charge_id,
        RequestOperation.STATUS,
        rail=rail.code,
        method="GET",
        path=f"/charges/{quote(charge_id, safe='')}",  # never the query: it carries the pay_token
        idempotency_key=None,
    )
    try:
        answer = adapter_for(rail).status(reference=charge_id, pay_token=pay_token)
    except RailError as exc:
        _record_error(request_id, exc)
        RAIL_REQUESTS.labels(rail=rail.code, operation="status", result=str(exc.http_status or "no_answer")).inc()
        raise
    RAIL_REQUESTS.labels(rail=rail.code, operation="status", result=str(answer.http_status)).inc()
    repository.record_answer(
        request_id, status_code=answer.http_status, rail_status=answer.status, excerpt=answer.body_excerpt
    )
    return answer


def _record_error(request_id: int, exc: RailError) -> None:
    # status_code NULL when nothing answered; the whole cause chain ("ConnectError <- OSError:
    # connection refused") is what an operator needs, redacted and bounded.
    repository.record_answer(
        request_id, status_code=exc.http_status, error=error_chain(exc, 1500), excerpt=exc.body_excerpt
    )
