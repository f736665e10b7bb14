"""The runner's poll-with-backoff primitive (jobs.primitives.ask_again.Ladder), cell by cell, and its two
users: the charge poll's ladder and the webhook delivery's retry schedule."""

from __future__ import annotations

import pytest

from charges.ladder import past_the_horizon, poll_delay
from charges.policy import RecoveryPolicy
from jobs.primitives.ask_again import Ladder
from webhooks.decisions import DEFAULT_SCHEDULE, delivery_delay

RUNGS = (1.0, 2.0, 5.0)


@pytest.mark.parametrize(
    ("asks", "repeat_last", "expected"),
    [
        (0, False, 1.0),
        (1, False, 1.0),
        (2, False, 2.0),
        (3, False, 5.0),
        (4, False, None),  # ran out: the caller's terminal transition
        (99, False, None),
        (0, True, 1.0),
        (3, True, 5.0),
        (4, True, 5.0),  # the last rung repeats
        (99, True, 5.0),
    ],
)
def test_a_ladder_waits_its_rungs_then_repeats_or_ends(asks, repeat_last, expected):
    assert Ladder(RUNGS, repeat_last=repeat_last).next_wait(asks) == expected


@pytest.mark.parametrize(
    ("age", "every", "expected"),
    [
        (None, 3600.0, 2.0),  # no age given: the ladder alone
        (9.9, 3600.0, 2.0),
        (10.0, 3600.0, 3600.0),  # at the horizon: its period
        (1e6, 3600.0, 3600.0),
        (10.0, None, None),  # no period past it: the horizon ends the ladder
    ],
)
def test_past_its_horizon_a_ladder_asks_on_its_period_or_ends(age, every, expected):
    ladder = Ladder(RUNGS, repeat_last=True, horizon=10.0, past_horizon_every=every)
    assert ladder.next_wait(2, age=age) == expected
    assert ladder.past(age) == (age is not None and age >= 10.0)


def test_a_ladder_without_a_horizon_is_never_past_it():
    assert Ladder(RUNGS).past(1e9) is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rungs": ()},
        {"rungs": (1.0, -1.0)},
        {"rungs": (1.0,), "horizon": -1.0},
        {"rungs": (1.0,), "past_horizon_every": 0.0},
    ],
)
def test_an_impossible_ladder_is_refused(kwargs):
    with pytest.raises(ValueError):
        Ladder(**kwargs)


def test_negative_asks_are_refused():
    with pytest.raises(ValueError):
        Ladder(RUNGS).next_wait(-1)


def test_the_charge_poll_and_the_webhook_retry_are_ladders():
    policy = RecoveryPolicy()
    # The poll: rung i after i polls, the last repeating; hourly past the horizon.
    assert [poll_delay(n, policy) for n in range(len(policy.ladder) + 2)] == [
        *policy.ladder,
        policy.ladder[-1],
        policy.ladder[-1],
    ]
    assert poll_delay(3, policy, past_horizon=True) == policy.past_horizon_every
    assert past_the_horizon(policy.horizon, policy) and not past_the_horizon(policy.horizon - 1, policy)
    # The webhook retry: its schedule, then exhausted.
    assert [delivery_delay(n) for n in range(1, len(DEFAULT_SCHEDULE) + 2)] == [*DEFAULT_SCHEDULE, None]
