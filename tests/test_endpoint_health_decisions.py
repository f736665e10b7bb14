"""The endpoint-health decision table (webhooks.health_decisions.decide), row by row."""

from __future__ import annotations

import itertools

import pytest

from webhooks.health_decisions import Evidence, Verdict, decide

W = 5 * 86400.0
HALF = W / 2
EPS = 1.0

SPANS = [None, 0.0, HALF - EPS, HALF, HALF + EPS, W - EPS, W, W + EPS, 10 * W]
WARNED = [None, 0.0, HALF - EPS, HALF, HALF + EPS, W, 10 * W]


def expected(span, warned_ago, window=W):
    """The rule, stated once more in the plainest terms."""
    if window <= 0 or span is None:
        return Verdict.OK
    if warned_ago is None:
        return Verdict.WARN if span >= window / 2 else Verdict.OK
    if span >= window and warned_ago >= window / 2:
        return Verdict.DISABLE
    return Verdict.OK


@pytest.mark.parametrize(("span", "warned_ago"), list(itertools.product(SPANS, WARNED)))
def test_every_span_and_warning_age_around_the_edges(span, warned_ago):
    assert decide(Evidence(span, warned_ago), W) is expected(span, warned_ago)


@pytest.mark.parametrize(
    ("span", "warned_ago", "verdict"),
    [
        (None, None, Verdict.OK),  # no streak: healthy, or nothing tried
        (HALF - EPS, None, Verdict.OK),  # failing, not yet half the window
        (HALF, None, Verdict.WARN),  # half the window: warn
        (W + EPS, None, Verdict.WARN),  # sparse traffic: past the window unwarned still warns first
        (HALF, 0.0, Verdict.OK),  # warned just now: nothing more
        (W, HALF - EPS, Verdict.OK),  # the window, but the warning is too fresh
        (W, HALF, Verdict.DISABLE),  # the window, warned half a window ago
        (W - EPS, 10 * W, Verdict.OK),  # warned long ago, span just short
    ],
)
def test_the_rows_that_matter_spelled_out(span, warned_ago, verdict):
    assert decide(Evidence(span, warned_ago), W) is verdict


@pytest.mark.parametrize(("span", "warned_ago"), list(itertools.product(SPANS, WARNED)))
def test_a_window_of_zero_never_warns_or_disables(span, warned_ago):
    assert decide(Evidence(span, warned_ago), 0.0) is Verdict.OK
