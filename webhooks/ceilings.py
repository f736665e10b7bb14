"""The webhooks app's ceilings for ``jobs.primitives.ceilings``: deliveries in flight per endpoint, a
worker's share of them, the receiver hosts' breakers, and the delivery ladder's length."""

from __future__ import annotations

from django.conf import settings

from jobs.primitives.ceilings import Ceiling, Scope, setting


def webhook_ceilings(scope: Scope) -> list[Ceiling]:
    from webhooks.services.delivery import worker_share

    share = worker_share(scope.concurrency)
    ladder = setting("VPAY_WEBHOOK_RETRY_SCHEDULE")
    return [
        setting("VPAY_WEBHOOK_MAX_IN_FLIGHT", "webhook.endpoint_max_in_flight"),
        Ceiling(
            "webhook.endpoint_worker_share",
            share if share is not None else "none (not a worker)",
            f"derived: half of worker.concurrency ({scope.concurrency_source})",
        ),
        setting("VPAY_WEBHOOK_BREAKER_FAILURES", "webhook_host.breaker_failures"),
        setting("VPAY_WEBHOOK_BREAKER_COOL_DOWN_SECONDS", "webhook_host.breaker_cool_down_seconds"),
        setting("VPAY_WEBHOOK_TIMEOUT", "webhook.timeout_seconds"),
        # An attempt per rung of the ladder, plus the first.
        Ceiling("webhook.delivery_max_attempts", len(settings.VPAY_WEBHOOK_RETRY_SCHEDULE) + 1, ladder.source),
    ]
