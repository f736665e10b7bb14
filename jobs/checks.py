"""Startup checks of the queue's configuration (also run by ``manage.py check``)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks

from jobs import registry
from jobs.kinds import JobKind

# Margin on top of the longest retry window: a late retry must still find its fence row.
FENCE_TTL_MARGIN_SECONDS = 3600.0


def longest_retry_window(spec: registry.KindSpec) -> float:
    """From a job's first claim to its last possible run: backoff waits plus a lease per attempt."""
    policy = registry.retry_policy(spec)
    return policy.longest_window() + policy.max_attempts * spec.lease_seconds


def fence_ttl_problems() -> list[str]:
    ttl = float(settings.VPAY_PROCESSED_JOBS_TTL_SECONDS)
    problems = []
    for spec in registry.all_specs():
        needed = longest_retry_window(spec) + FENCE_TTL_MARGIN_SECONDS
        if ttl < needed:
            problems.append(
                f"VPAY_PROCESSED_JOBS_TTL_SECONDS={ttl:g} is shorter than kind {spec.kind.value!r}'s "
                f"longest retry window plus margin ({needed:g} s): a late retry after the fence "
                f"row expired would apply its effect twice"
            )
    return problems


@checks.register(checks.Tags.compatibility, deploy=False)
def check_fence_ttl(app_configs=None, **kwargs):
    return [checks.Error(p, id="jobs.E001") for p in fence_ttl_problems()]


def retention_problems() -> list[str]:
    """A settled dead letter outlives its fence horizon (while a replay could still matter,
    "was it replayed, by whom?" must be answerable); an alert outlives its sending."""
    problems = []
    letters = settings.VPAY_RETENTION_DEAD_LETTERS_DAYS
    if letters * 86400.0 < float(settings.VPAY_PROCESSED_JOBS_TTL_SECONDS):
        problems.append(
            f"VPAY_RETENTION_DEAD_LETTERS_DAYS={letters} is shorter than VPAY_PROCESSED_JOBS_TTL_SECONDS"
            " (the replay window): a settled letter would go before its fence"
        )
    if settings.VPAY_RETENTION_ALERTS_DAYS < 1:
        problems.append("VPAY_RETENTION_ALERTS_DAYS must be at least 1")
    return problems


@checks.register()
def check_retention(app_configs=None, **kwargs):
    return [checks.Error(p, id="jobs.E003") for p in retention_problems()]


@checks.register()
def check_kinds_registered(app_configs=None, **kwargs):
    missing = set(JobKind.values) - registry.registered_kinds()
    return [checks.Error(f"job kind {k!r} is declared but has no handler", id="jobs.E002") for k in sorted(missing)]
