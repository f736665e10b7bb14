"""jobs.primitives.retry.RetryPolicy: ceilings, full-jitter backoff, the longest window, validation."""

from __future__ import annotations

import random

import pytest

from jobs.primitives.retry import DEFAULT_RETRY, RetryPolicy


def test_the_default_policy_is_five_attempts_base_30_seconds_cap_one_hour():
    assert (DEFAULT_RETRY.max_attempts, DEFAULT_RETRY.base_seconds, DEFAULT_RETRY.cap_seconds) == (5, 30.0, 3600.0)


def test_ceiling__doubles_from_the_base_until_the_cap():
    ceilings = [DEFAULT_RETRY.ceiling(n) for n in range(1, 11)]
    assert ceilings == [30, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]


def test_ceiling__of_attempt_zero_or_below_is_the_base():
    assert DEFAULT_RETRY.ceiling(0) == 30
    assert DEFAULT_RETRY.ceiling(-3) == 30


@pytest.mark.parametrize("attempt", [63, 64, 65, 1_000, 10**9])
def test_ceiling__of_a_huge_attempt_number_is_the_cap_without_overflow(attempt):
    assert DEFAULT_RETRY.ceiling(attempt) == 3600


def test_ceiling__with_base_equal_to_cap_is_constant():
    policy = RetryPolicy(base_seconds=10, cap_seconds=10)
    assert {policy.ceiling(n) for n in range(1, 20)} == {10}


@pytest.mark.parametrize("policy", [DEFAULT_RETRY, RetryPolicy(max_attempts=8, base_seconds=0.5, cap_seconds=7)])
def test_backoff__is_always_within_zero_and_the_ceiling(policy):
    rng = random.Random(1234)
    for attempt in range(1, 13):
        ceiling = policy.ceiling(attempt)
        samples = [policy.backoff(attempt, rng) for _ in range(300)]
        assert all(0.0 <= s <= ceiling for s in samples), attempt
        # Full jitter spreads over the whole range, not just near one end.
        assert min(samples) < ceiling * 0.1
        assert max(samples) > ceiling * 0.9


def test_backoff__is_reproducible_with_a_seeded_rng():
    first = [DEFAULT_RETRY.backoff(n, random.Random(7)) for n in range(1, 6)]
    again = [DEFAULT_RETRY.backoff(n, random.Random(7)) for n in range(1, 6)]
    assert first == again


def test_backoff__with_a_zero_base_is_zero():
    policy = RetryPolicy(base_seconds=0, cap_seconds=0)
    assert policy.backoff(3, random.Random(0)) == 0.0


def test_longest_window__sums_the_ceilings_of_every_retry_wait():
    # Five attempts have four waits between them: 30 + 60 + 120 + 240.
    assert DEFAULT_RETRY.longest_window() == 450


def test_longest_window__counts_the_cap_once_reached():
    policy = RetryPolicy(max_attempts=6, base_seconds=10, cap_seconds=50)
    assert policy.longest_window() == 10 + 20 + 40 + 50 + 50


def test_longest_window__of_a_single_attempt_is_zero():
    assert RetryPolicy(max_attempts=1).longest_window() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"base_seconds": -1},
        {"base_seconds": 100, "cap_seconds": 99},
        {"base_seconds": 30, "cap_seconds": 0},
    ],
)
def test_retry_policy__refuses_impossible_settings(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_retry_policy__accepts_a_zero_base_and_a_single_attempt():
    policy = RetryPolicy(max_attempts=1, base_seconds=0, cap_seconds=0)
    assert policy.ceiling(1) == 0
