"""The delivery ladder, the fan-out disposition and the attempt-result table, cell by cell."""

from __future__ import annotations

import pytest

from webhooks.decisions import (
    DEFAULT_SCHEDULE,
    FAN_OUT_TRANSIENT_ALERT_AFTER,
    AttemptResult,
    FanOut,
    Next,
    after_failure,
    attempt_result,
    delivery_delay,
    fan_out_disposition,
    parse_schedule,
    stuck_alert_due,
)


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 5.0), (2, 300.0), (3, 1800.0), (4, 7200.0), (5, 18000.0), (6, 36000.0), (7, 36000.0), (8, None), (50, None)],
)
def test_the_default_ladder(attempt, delay):
    assert delivery_delay(attempt) == delay


def test_the_default_ladder_spans_more_than_a_day():
    assert 24 * 3600 < sum(DEFAULT_SCHEDULE) < 30 * 3600


def test_a_shrunk_schedule_goes_through_the_same_function():
    schedule = parse_schedule("0.1, 0.2,0.3")
    assert [delivery_delay(n, schedule) for n in range(1, 5)] == [0.1, 0.2, 0.3, None]


def test_attempt_numbers_are_one_based():
    with pytest.raises(ValueError):
        delivery_delay(0)


@pytest.mark.parametrize("text", ["", " , ", "5,-1", "nan", "inf", "5,x"])
def test_bad_schedules_are_refused(text):
    with pytest.raises(ValueError):
        parse_schedule(text)


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [(1, (Next.RETRY, 0.1)), (2, (Next.RETRY, 0.2)), (3, (Next.EXHAUSTED, None)), (9, (Next.EXHAUSTED, None))],
)
def test_after_failure(attempts, expected):
    assert after_failure(attempts, (0.1, 0.2)) == expected


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        (None, FanOut.NOT_PENDING),
        (1, FanOut.RETRY),
        (2, FanOut.RETRY),
        (3, FanOut.RETRY),
        (4, FanOut.RETRY),
        (5, FanOut.ABANDON),
        (6, FanOut.ABANDON),  # a count past the limit (raised concurrently) still abandons
    ],
)
def test_fan_out_disposition(failures, expected):
    assert fan_out_disposition(failures) is expected


def test_fan_out_disposition_with_another_limit():
    assert fan_out_disposition(1, max_passes=1) is FanOut.ABANDON
    assert fan_out_disposition(None, max_passes=1) is FanOut.NOT_PENDING


@pytest.mark.parametrize(
    ("transient_failures", "due"),
    [
        (None, False),  # no longer pending: nothing to say
        (1, False),
        (FAN_OUT_TRANSIENT_ALERT_AFTER - 1, False),
        (FAN_OUT_TRANSIENT_ALERT_AFTER, True),  # the pass that reaches the bound, and only it
        (FAN_OUT_TRANSIENT_ALERT_AFTER + 1, False),
        (10 * FAN_OUT_TRANSIENT_ALERT_AFTER, False),
    ],
)
def test_a_stuck_event_alerts_exactly_at_the_bound(transient_failures, due):
    assert stuck_alert_due(transient_failures) is due


def test_a_stuck_event_alerts_at_another_bound():
    assert [n for n in range(1, 6) if stuck_alert_due(n, alert_after=2)] == [2]


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (None, AttemptResult.NO_RESPONSE),
        (100, AttemptResult.FAILED),
        (199, AttemptResult.FAILED),
        (200, AttemptResult.SUCCEEDED),
        (202, AttemptResult.SUCCEEDED),
        (204, AttemptResult.SUCCEEDED),
        (299, AttemptResult.SUCCEEDED),
        (301, AttemptResult.FAILED),  # redirects are never followed
        (302, AttemptResult.FAILED),
        (308, AttemptResult.FAILED),
        (400, AttemptResult.FAILED),
        (410, AttemptResult.FAILED),
        (429, AttemptResult.FAILED),
        (500, AttemptResult.FAILED),
        (503, AttemptResult.FAILED),
    ],
)
def test_attempt_result(status, result):
    assert attempt_result(status) is result
