"""What the sandbox rail holds: charges, refunds, scenarios and its request log, and the
pure answer a poll gets (``sandbox.rail`` serves them over HTTP)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

MAX_LOG = 50_000

BUILT_IN = {
    402: {"outcome": "failed", "failure_code": "insufficient_funds"},
    503: {"error_polls": -1},
    404: {"not_found_polls": 3},
}
SCENARIO_FIELDS = {
    "outcome": str,
    "failure_code": str,
    "after_polls": int,
    "error_polls": int,
    "not_found_polls": int,
    "error_submits": int,
    "drop_submits": int,
    "lose_submits": int,
    "submit_delay": (int, float),
    "poll_delay": (int, float),
    "submit_status": int,
    "submit_records": bool,
    "submit_body": str,
    "error_status": int,
    "retry_after": str,
    "url_style": str,
    "echo_credentials": bool,
    "capture_error": int,
    "capture_drop": int,
    "capture_refuse": int,
    "capture_delay": (int, float),
    "void_error": int,
    "void_drop": int,
    "void_delay": (int, float),
}


@dataclass
class RailCharge:
    reference: str
    rail: str
    amount: int
    currency: str
    pay_token: str | None
    polls: int = 0
    forced: str | None = None  # the payer page's result
    capture: bool = True  # false: an authorization, captured (or voided) by a later call
    # What the rail has answered for good (a poll, the payer page, a capture or a void):
    # None while pending, else "authorized", "succeeded", "failed" or "canceled".
    settled: str | None = None
    amount_captured: int | None = None  # set by a capture only
    captures: int = 0  # capture requests received (errored and dropped ones too)
    voids: int = 0


@dataclass
class RailRefund:
    reference: str
    rail: str
    charge_reference: str
    amount: int
    currency: str
    polls: int = 0
    forced: str | None = None  # never set: refunds have no payer page
    failed: bool = False  # answered failed: its amount no longer counts against the charge


@dataclass
class State:
    api_key: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    charges: dict[tuple[str, str], RailCharge] = field(default_factory=dict)
    refunds: dict[tuple[str, str], RailRefund] = field(default_factory=dict)
    by_reference: dict[str, dict] = field(default_factory=dict)
    by_amount: dict[int, dict] = field(default_factory=dict)
    submits: dict[tuple[str, str], int] = field(default_factory=dict)  # submits seen per reference
    log: list[dict] = field(default_factory=list)

    def scenario(self, reference: str, amount: int | None) -> dict:
        if reference in self.by_reference:
            return self.by_reference[reference]
        if amount is not None and amount in self.by_amount:
            return self.by_amount[amount]
        if amount is not None:
            return BUILT_IN.get(amount % 1000, {})
        return {}

    def record(self, entry: dict) -> dict:
        self.log.append(entry)
        if len(self.log) > MAX_LOG:
            del self.log[: len(self.log) - MAX_LOG]
        return entry


def poll_answer(charge: RailCharge | RailRefund, scenario: dict) -> tuple[int, str | None]:
    """(HTTP status, rail status) for the charge's next poll, counting it. Pure over its inputs."""
    charge.polls += 1
    n = charge.polls
    errors = scenario.get("error_polls", 0)
    if errors < 0 or n <= errors:
        return scenario.get("error_status", 503), None
    n -= errors
    not_found = scenario.get("not_found_polls", 0)
    if n <= not_found:
        return 404, None
    n -= not_found
    if charge.forced:
        return 200, charge.forced
    if n >= scenario.get("after_polls", 1):
        return 200, scenario.get("outcome", "succeeded")
    return 200, "pending"


def charge_poll(charge: RailCharge, scenario: dict) -> tuple[int, str | None]:
    """``poll_answer`` for a charge, keeping ``charge.settled``. An automatic charge
    (capture true, never voided) answers exactly as ``poll_answer``; an authorization
    answers ``authorized`` for ``succeeded`` and then what it settled as. A captured or
    voided charge answers that for good, after its ``error_polls``."""
    if charge.settled == "canceled" or charge.amount_captured is not None:
        charge.polls += 1
        errors = scenario.get("error_polls", 0)
        if errors < 0 or charge.polls <= errors:
            return scenario.get("error_status", 503), None
        return 200, charge.settled
    code, status = poll_answer(charge, scenario)
    if code != 200:
        return code, status
    if charge.capture:
        if status in ("succeeded", "failed"):
            charge.settled = status
        return code, status
    if charge.settled is None and status in ("succeeded", "failed"):
        charge.settled = "authorized" if status == "succeeded" else status
    return code, charge.settled or status
