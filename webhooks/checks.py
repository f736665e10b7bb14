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


@checks.register()
def check_webhook_settings(app_configs=None, **kwargs):
    return [checks.Error(p, id="webhooks.E001") for p in lease_problems()]
