"""The charges app's ceilings for ``jobs.primitives.ceilings``: rails in flight, a worker's share of
them, the rails' breakers, and the recovery policy's caps (charges/policy.py)."""

from __future__ import annotations

from jobs.primitives.ceilings import Ceiling, Scope, setting


def rail_ceilings(scope: Scope) -> list[Ceiling]:
    from charges.services.rail_gate import worker_share

    share = worker_share(scope.concurrency)
    return [
        setting("VPAY_RAIL_MAX_IN_FLIGHT", "rail.max_in_flight"),
        Ceiling(
            "rail.worker_share",
            share if share is not None else "none (not a worker)",
            f"derived: half of worker.concurrency ({scope.concurrency_source})",
        ),
        setting("VPAY_RAIL_BREAKER_FAILURES", "rail.breaker_failures"),
        setting("VPAY_RAIL_BREAKER_COOL_DOWN_SECONDS", "rail.breaker_cool_down_seconds"),
        setting("VPAY_RAIL_TIMEOUT_SECONDS", "rail.timeout_seconds"),
        setting("VPAY_CHARGE_NOT_FOUND_STREAK", "recovery.not_found_streak"),
        setting("VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS", "recovery.not_found_window_seconds"),
        setting("VPAY_CHARGE_HORIZON_SECONDS", "recovery.horizon_seconds"),
        setting("VPAY_CHARGE_POLL_PAST_HORIZON_SECONDS", "recovery.past_horizon_every_seconds"),
        setting("VPAY_CHARGE_CONFIRM_GRACE_SECONDS", "recovery.confirm_grace_seconds"),
    ]
