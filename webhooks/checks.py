"""Startup checks of the webhook settings (also run by ``manage.py check``)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


def lease_problems() -> list[str]:
    lease, timeout = settings.VPAY_WEBHOOK_LEASE_SECONDS, settings.VPAY_WEBHOOK_TIMEOUT
    problems = []
    if lease < 2 * timeout:
        problems.append(
            f"VPAY_WEBHOOK_LEASE_SECONDS={lease:g} is shorter than twice VPAY_WEBHOOK_TIMEOUT={timeout:g}: "
            "a live attempt's lease could expire mid-request and the webhook be sent twice at once"
        )
    if settings.VPAY_WEBHOOK_CONNECT_TIMEOUT <= 0 or timeout <= 0:
        problems.append("VPAY_WEBHOOK_CONNECT_TIMEOUT and VPAY_WEBHOOK_TIMEOUT must be positive")
    if settings.VPAY_WEBHOOK_MAX_IN_FLIGHT < 1:
        problems.append("VPAY_WEBHOOK_MAX_IN_FLIGHT must be at least 1")
    return problems


DAY = 86400.0


def retention_problems() -> list[str]:
    """Windows that would delete what a retry, a re-read or the health check still needs."""
    ladder = sum(settings.VPAY_WEBHOOK_RETRY_SCHEDULE)
    health = float(settings.VPAY_WEBHOOK_DISABLE_AFTER_DAYS) * DAY
    problems = []
    if health < 0:
        problems.append("VPAY_WEBHOOK_DISABLE_AFTER_DAYS cannot be negative (0 switches the check off)")
    elif 0 < health <= ladder:
        problems.append(
            f"VPAY_WEBHOOK_DISABLE_AFTER_DAYS={health / DAY:g} must exceed the delivery ladder ({ladder / DAY:.2f} days):"
            " one event's retries alone would disable an endpoint"
        )
    for name, needed, why in (
        ("VPAY_RETENTION_EVENTS_DAYS", ladder + DAY, "the delivery ladder plus a day"),
        (
            "VPAY_RETENTION_DELIVERIES_DAYS",
            max(ladder + DAY, 2 * health),
            "the ladder plus a day, and the health lookback",
        ),
    ):
        days = getattr(settings, name)
        if days * DAY < needed:
            problems.append(f"{name}={days} is shorter than {why} ({needed / DAY:.2f} days)")
    return problems


@checks.register()
def check_webhook_settings(app_configs=None, **kwargs):
    return [checks.Error(p, id="webhooks.E001") for p in lease_problems() + retention_problems()]
