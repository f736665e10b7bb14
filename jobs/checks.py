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


@checks.register()
def check_kinds_registered(app_configs=None, **kwargs):
    missing = set(JobKind.values) - registry.registered_kinds()
    return [checks.Error(f"job kind {k!r} is declared but has no handler", id="jobs.E002") for k in sorted(missing)]
