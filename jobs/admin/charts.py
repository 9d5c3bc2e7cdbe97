"""Inline SVG charts for the admin: stacked bars and lines, drawn on the server.

Nothing is fetched at run time (no CDN, no script). Colours come from CSS
classes the page styles with the admin's variables (``--body-fg``,
``--hairline-color``), so the charts follow its light and dark themes; every
value from the ledger goes through ``format_html``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    css_class: str


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (axis top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _y(value: float, top: float) -> str:
    return _f(TOP + PLOT_H * (1 - value / top))


def _f(coordinate: float) -> str:
    # format_html escapes its arguments to text first: numbers are formatted here.
    return f"{coordinate:.1f}"


def _axes(labels: Sequence[str], top: float, unit: str, every: int) -> SafeString:
    grid = format_html_join(
        "",
        '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
        '<text class="tick" x="{}" y="{}" text-anchor="end">{}{}</text>',
        (
            (
                LEFT,
                WIDTH - RIGHT,
                _y(v, top),
                _y(v, top),
                LEFT - 4,
                _f(float(_y(v, top)) + 3),
                _number(v),
                unit,
            )
            for v in (top * i / 4 for i in range(5))
        ),
    )
    slot = PLOT_W / max(1, len(labels))
    ticks = format_html_join(
        "",
        '<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (_f(LEFT + slot * (i + 0.5)), HEIGHT - 6, label)
            for i, label in enumerate(labels)
            if (len(labels) - 1 - i) % every == 0
        ),
    )
    return format_html("{}{}", grid, ticks)


def _figure(svg_body: SafeString, title: str, legend: SafeString, chart_id: str) -> SafeString:
    return format_html(
        '<figure class="chart" id="{}"><figcaption>{}</figcaption>'
        '<svg viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'preserveAspectRatio="xMidYMid meet">{}</svg><ul class="legend">{}</ul></figure>',
        chart_id,
        title,
        WIDTH,
        HEIGHT,
        title,
        svg_body,
        legend,
    )


def _legend(series: Sequence[Series], totals: Sequence[str]) -> SafeString:
    return format_html_join(
        "",
        '<li data-series="{}"><span class="swatch {}"></span>{} <b>{}</b></li>',
        ((s.name, s.css_class, s.name, total) for s, total in zip(series, totals, strict=True)),
    )


def stacked_bars(
    chart_id: str, title: str, labels: Sequence[str], series: Sequence[Series], *, every: int
) -> SafeString:
    """One bar per label, the series stacked bottom-up in the given order."""
    stacks = [sum(s.values[i] or 0 for s in series) for i in range(len(labels))]
    top = nice_ceiling(max(stacks, default=0))
    slot = PLOT_W / max(1, len(labels))
    bars = []
    for i, label in enumerate(labels):
        base = 0.0
        for s in series:
            value = s.values[i] or 0
            if not value:
                continue
            y0, y1 = float(_y(base, top)), float(_y(base + value, top))
            bars.append(
                (
                    s.css_class,
                    s.name,
                    _number(value),
                    _f(LEFT + slot * i + slot * 0.1),
                    _f(y1),
                    _f(slot * 0.8),
                    _f(max(y0 - y1, 0.5)),
                    label,
                    s.name,
                    _number(value),
                )
            )
            base += value
    body = format_html_join(
        "",
        '<rect class="bar {}" data-series="{}" data-value="{}" x="{}" y="{}" '
        'width="{}" height="{}"><title>{}: {} {}</title></rect>',
        bars,
    )
    totals = [_number(sum(v or 0 for v in s.values)) for s in series]
    return _figure(
        format_html("{}{}", _axes(labels, top, "", every), body),
        title,
        _legend(series, totals),
        chart_id,
    )


def lines(
    chart_id: str,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    every: int,
    unit: str,
) -> SafeString:
    """One line per series; a missing value breaks the line (no data, not zero)."""
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0))
    slot = PLOT_W / max(1, len(labels))
    paths = []
    for s in series:
        points = [
            (_f(LEFT + slot * (i + 0.5)), _y(v, top), labels[i], v)
            for i, v in enumerate(s.values)
            if v is not None
        ]
        runs: list[str] = []
        previous = None
        for i, v in enumerate(s.values):
            if v is None:
                previous = None
                continue
            x = _f(LEFT + slot * (i + 0.5))
            runs.append(f"{'L' if previous is not None else 'M'}{x},{_y(v, top)}")
            previous = i
        dots = format_html_join(
            "",
            '<circle cx="{}" cy="{}" r="2.5"><title>{}: {} {}{}</title></circle>',
            ((x, y, label, s.name, _number(v), unit) for x, y, label, v in points),
        )
        paths.append(
            format_html(
                '<g class="line {}" data-series="{}" data-points="{}">'
                '<path d="{}" fill="none"/>{}</g>',
                s.css_class,
                s.name,
                len(points),
                " ".join(runs),
                dots,
            )
        )
    worst = [
        (_number(max(v for v in s.values if v is not None)) + f" {unit}")
        if any(v is not None for v in s.values)
        else "-"
        for s in series
    ]
    body = format_html_join("", "{}", ((p,) for p in paths))
    return _figure(
        format_html("{}{}", _axes(labels, top, unit, every), body),
        title,
        _legend(series, worst),
        chart_id,
    )
