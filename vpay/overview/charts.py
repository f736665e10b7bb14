"""Chart layout for the overview, drawn server-side as inline SVG by the template: these
functions only compute geometry (pure; tested), so the page needs no script and nothing from
the network."""

from __future__ import annotations

from dataclasses import dataclass, field

# Series colours readable on the admin's light and dark themes.
GREEN, RED, AMBER, BLUE, GREY = "#3f9c35", "#d64545", "#e0a100", "#417690", "#8a8a8a"


@dataclass(frozen=True, slots=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    color: str
    series: str
    value: float


@dataclass(frozen=True, slots=True)
class Bar:
    """One row of a horizontal bar chart (its label left, its segments, its value text right)."""

    y: float
    text_y: float
    label: str
    text: str
    segments: list[Segment]


@dataclass(frozen=True, slots=True)
class BarChart:
    width: int
    height: int
    label_width: int
    text_x: float
    bars: list[Bar]
    legend: list[tuple[str, str]]


def bar_chart(
    rows: list[tuple[str, list[float], str]],
    series: list[tuple[str, str]],
    *,
    width: int = 560,
    label_width: int = 170,
    text_width: int = 90,
    bar_height: int = 18,
    gap: int = 8,
) -> BarChart:
    """Stacked horizontal bars: ``rows`` are (label, one value per series, value text),
    ``series`` (name, colour). The longest total spans the plot; a zero draws nothing."""
    plot = width - label_width - text_width
    top = max((sum(values) for _, values, _ in rows), default=0) or 1
    bars = []
    for i, (label, values, text) in enumerate(rows):
        y = i * (bar_height + gap)
        x = float(label_width)
        segments = []
        for value, (name, color) in zip(values, series, strict=True):
            w = plot * value / top
            if w > 0:
                segments.append(Segment(round(x, 2), y, round(w, 2), bar_height, color, name, value))
            x += w
        bars.append(Bar(y, y + bar_height * 0.75, label, text, segments))
    height = max(len(rows) * (bar_height + gap) - gap, 0)
    return BarChart(width, height, label_width, float(label_width + plot + 6), bars, list(series))


@dataclass(frozen=True, slots=True)
class ColumnChart:
    width: int
    height: int
    plot_top: int
    plot_bottom: int
    top_value: float
    columns: list[list[Segment]]
    ticks: list[tuple[float, str]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)


def column_chart(
    buckets: list[list[float]],
    series: list[tuple[str, str]],
    *,
    bucket_seconds: int,
    width: int = 560,
    height: int = 170,
    left: int = 40,
    bottom: int = 22,
    top: int = 8,
) -> ColumnChart:
    """Stacked columns over time: ``buckets`` oldest first, each one value per series. The
    axis is labelled in minutes back from now; the top value is the tallest column."""
    n = len(buckets)
    plot_h = height - top - bottom
    highest = max((sum(values) for values in buckets), default=0)
    scale = highest or 1
    step = (width - left) / n if n else 0
    columns = []
    for i, values in enumerate(buckets):
        x = left + i * step + 1
        y = float(height - bottom)
        segments = []
        for value, (name, color) in zip(values, series, strict=True):
            h = plot_h * value / scale
            if h > 0:
                y -= h
                segments.append(Segment(round(x, 2), round(y, 2), round(step - 2, 2), round(h, 2), color, name, value))
        columns.append(segments)
    ticks = []
    for i in range(0, n + 1, max(n // 4, 1)):
        back = (n - i) * bucket_seconds // 60
        ticks.append((round(left + i * step, 2), "now" if back == 0 else f"-{back} min"))
    return ColumnChart(width, height, top, height - bottom, highest, columns, ticks, list(series))
