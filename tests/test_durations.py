"""jobs.operator.durations.humanize_seconds, cell by cell."""

import pytest

from jobs.operator.durations import humanize_seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (-5, "0s"),
        (0, "0s"),
        (7.9, "7s"),
        (59, "59s"),
        (60, "1m 0s"),
        (61, "1m 1s"),
        (3599, "59m 59s"),
        (3600, "1h 0m"),
        (3 * 3600 + 5, "3h 0m"),
        (7380, "2h 3m"),
        (86399, "23h 59m"),
        (86400, "1d 0h"),
        (2 * 86400 + 3 * 3600 + 59, "2d 3h"),
        (400 * 86400, "400d 0h"),
    ],
)
def test_humanize_seconds(seconds, text):
    assert humanize_seconds(seconds) == text
