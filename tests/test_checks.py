"""jobs.checks: the fence TTL must outlast every kind's longest retry window, with margin."""

from __future__ import annotations

from jobs import registry
from jobs.checks import FENCE_TTL_MARGIN_SECONDS, check_fence_ttl, fence_ttl_problems, longest_retry_window


def needed_ttl() -> float:
    return max(longest_retry_window(spec) for spec in registry.all_specs()) + FENCE_TTL_MARGIN_SECONDS


def test_fence_ttl_problems__is_empty_with_the_default_settings():
    assert fence_ttl_problems() == []
    assert check_fence_ttl() == []


def test_fence_ttl_problems__names_every_kind_whose_window_a_short_ttl_does_not_cover(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 3600
    problems = fence_ttl_problems()
    # Every kind's retry window outlasts an hour, so each is named once.
    kinds = registry.registered_kinds()
    assert len(problems) == len(kinds) and {"task", "sweep_expired"} <= kinds
    for kind in kinds:
        assert sum(f"kind '{kind}'" in p for p in problems) == 1
    assert all("VPAY_PROCESSED_JOBS_TTL_SECONDS=3600" in p for p in problems)
    errors = check_fence_ttl()
    assert [e.id for e in errors] == ["jobs.E001"] * len(kinds)


def test_the_task_kinds_window_is_its_backoff_waits_plus_a_lease_per_attempt():
    spec = registry.get("task")
    # Defaults: waits 30 + 60 + 120 + 240, and five leases of (300 s timeout + 30 s margin).
    assert longest_retry_window(spec) == 450 + 5 * 330


def test_fence_ttl_problems__holds_exactly_at_the_needed_ttl_and_fails_one_second_below(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = needed_ttl()
    assert fence_ttl_problems() == []
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = needed_ttl() - 1
    problems = fence_ttl_problems()
    assert problems
    assert all(f"({needed_ttl():g} s)" in p for p in problems)


def test_fence_ttl_problems__follows_the_task_retry_settings(settings):
    settings.VPAY_TASK_MAX_ATTEMPTS = 20
    settings.VPAY_TASK_RETRY_CAP_SECONDS = 86_400
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 24 * 3600
    # Twenty attempts with a day's cap need more than a week of fence.
    (problem,) = fence_ttl_problems()
    assert "kind 'task'" in problem
