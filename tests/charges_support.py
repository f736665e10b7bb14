"""Helpers for the charges tests: a merchant's API client, rails pointed at the sandbox
process, the worker's environment with a shrunk RecoveryPolicy, and SQL readers."""

from __future__ import annotations

import json
from pathlib import Path

from django.db import connection

from charges.rails import forget_configured_rails
from tests.api_support import MerchantClient
from vpay import sealing


class Merchant(MerchantClient):
    """A merchant's API client with the charges calls."""

    def intent(self, amount: int = 1000, rail: str = "sandbox_push", **extra) -> dict:
        response = self.call(
            "POST", "/v1/payment_intents", {"amount": amount, "currency": "usd", "rail": rail, **extra}
        )
        assert response.status_code == 200, response.content
        return response.json()

    def confirm(self, intent_id: str, **kw) -> dict:
        response = self.call("POST", f"/v1/payment_intents/{intent_id}/confirm", **kw)
        assert response.status_code == 200, response.content
        return response.json()


def use_rails(settings, tmp_path: Path, rails: dict) -> str:
    """Point this process (and, through the returned path, a worker) at ``rails``."""
    path = tmp_path / "rails.json"
    path.write_text(json.dumps(rails))
    settings.VPAY_RAILS_FILE = str(path)
    forget_configured_rails()
    return str(path)


# A RecoveryPolicy shrunk to test speed, set through the same settings production reads.
FAST_POLICY = {
    "VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS": 1.5,
    "VPAY_CHARGE_NOT_FOUND_STREAK": 3,
    "VPAY_CHARGE_HORIZON_SECONDS": 3600.0,
    "VPAY_CHARGE_POLL_LADDER_SECONDS": "0.05,0.1,0.1,0.2",
    "VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS": 0.5,
    "VPAY_CHARGE_WAIT_MARGIN_SECONDS": 0.05,
    "VPAY_CHARGE_CONFIRM_GRACE_SECONDS": 0.5,
    "VPAY_RAIL_CONNECT_TIMEOUT_SECONDS": 0.3,
    "VPAY_RAIL_TIMEOUT_SECONDS": 1.0,
    # A rail answering 503 forever opens its breaker; a recovered rail is then heard at the
    # next probe, a cool-down later (30 s by default).
    "VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS": 1.0,
}


def apply_policy(settings, policy: dict) -> None:
    """The same numbers in this (web) process's settings."""
    for name, value in policy.items():
        if name in ("VPAY_CHARGE_POLL_LADDER_SECONDS", "VPAY_REFUND_POLL_LADDER_SECONDS"):
            value = [float(x) for x in str(value).split(",")]
        setattr(settings, name, value)


def worker_env(rails_file: str, policy: dict) -> dict[str, str]:
    return {"VPAY_RAILS_FILE": rails_file, **{k: str(v) for k, v in policy.items()}}


def sql(query: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def scalar(query: str, params=None):
    rows = sql(query, params)
    return rows[0][0] if rows else None


def charge_of(intent_id: str) -> dict | None:
    rows = sql(
        "SELECT id, status, failure_code, pay_token, redirect_url, not_found_count,"
        " extract(epoch FROM updated_at - created_at)::float8, updated_at FROM charges WHERE intent_id = %s",
        [intent_id],
    )
    if not rows:
        return None
    r = list(rows[0])
    # Sealed at rest, each for its row and column.
    r[3] = sealing.open_text(r[3], sealing.bound("charges", "pay_token", r[0]))
    r[4] = sealing.open_text(r[4], sealing.bound("charges", "redirect_url", r[0]))
    keys = (
        "id",
        "status",
        "failure_code",
        "pay_token",
        "redirect_url",
        "not_found_count",
        "settled_after",
        "updated_at",
    )
    return dict(zip(keys, r, strict=True))


def intent_status(intent_id: str) -> str:
    return scalar("SELECT status FROM payment_intents WHERE id = %s", [intent_id])


# The events that report a payment's or a refund's progress rather than its outcome
# (tests/test_lifecycle_events.py checks them): left out by events() unless asked for, so a
# test of an outcome reads the outcome's events.
PROGRESS_EVENTS = [
    "payment_intent.created",
    "payment_intent.processing",
    "payment_intent.requires_action",
    "refund.created",
    "refund.updated",
    "charge.refunded",
]


def events(object_id: str, type_: str | None = None, *, progress: bool = False) -> list[tuple[str, dict]]:
    """The events of an object (or of an intent's objects), in commit order; the progress
    events only when ``progress`` or named by ``type_``."""
    rows = sql(
        "SELECT type, data FROM events WHERE (data->>'id' = %s OR data->>'payment_intent' = %s)"
        " AND (%s::text IS NULL OR type = %s) AND (%s OR %s::text IS NOT NULL OR type <> ALL(%s))"
        " ORDER BY created_at, id",
        [object_id, object_id, type_, type_, progress, type_, PROGRESS_EVENTS],
    )
    return [(t, d if isinstance(d, dict) else json.loads(d)) for t, d in rows]


def poll_job(charge_id: str) -> dict | None:
    rows = sql(
        "SELECT extract(epoch FROM run_at - now())::float8, locked_at IS NOT NULL, last_error, attempts"
        " FROM jobs WHERE dedupe_key = %s",
        [f"charge:poll:{charge_id}"],
    )
    if not rows:
        return None
    due_in, leased, last_error, attempts = rows[0]
    return {"due_in": due_in, "leased": leased, "last_error": last_error, "attempts": attempts}


def run_worker_until(until, *, worker_id: str = "w-in-process", timeout: float = 15.0) -> None:
    """Run a worker in this process (``Worker.run_once``, due jobs) until ``until()`` holds."""
    from jobs.runner.worker import Worker
    from tests.conftest import wait_for

    worker = Worker(worker_id=worker_id)

    def step() -> bool:
        worker.run_once()
        return until()

    wait_for(step, timeout=timeout, interval=0.05, message="the worker to get there")
