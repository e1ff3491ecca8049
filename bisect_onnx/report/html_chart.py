"""The HTML report's chart: each comparison's max abs error along the graph, log scale.

An inline SVG with the atol line, one dot per comparison (linked to its table row) and
a mark at the culprit (the node that introduces the error; else the first divergence,
or at parity the first hidden divergence), and a legend for what the dots cannot show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bisect_onnx.report.formatting import format_number
from bisect_onnx.report.html_markup import (
    TOLERANCE_RULE,
    element,
    escaped,
    module_label,
    section,
)

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["chart_section", "marked_record"]

# Chart geometry in SVG user units; the SVG scales to the page width.
_WIDTH = 960
_HEIGHT = 340
_LEFT = 64
_RIGHT = 24
_TOP = 30
_BOTTOM = 46
# Exact zeros cannot sit on a log axis; with no positive error at all they go here.
_DEFAULT_FLOOR = 1e-12
# More labelled decades or indices than this crowd the axes.
_MAX_DECADE_LABELS = 9
_MAX_INDEX_LABELS = 12


@dataclass(frozen=True)
class _Scale:
    """Maps comparison indices and errors (log scale) to SVG coordinates."""

    count: int
    floor: float
    """Errors below this (exact zeros) are drawn at it."""
    low: int
    """Decade exponent at the bottom of the axis."""
    high: int
    """Decade exponent at the top; errors with no figure (a shape mismatch) sit here."""

    @classmethod
    def for_errors(cls, errors: Sequence[float | None], atol: float) -> _Scale:
        """A scale spanning every positive error, a floor below them, and ``atol``."""
        positive = [error for error in errors if _drawable(error) and error > 0]
        # A whole decade below the smallest error, so zeros sit apart from it on a tick.
        floor = 10.0 ** math.floor(math.log10(min(positive) / 10)) if positive else _DEFAULT_FLOOR
        bottom = min([floor, atol] if atol > 0 else [floor])
        top = max([*positive, atol, floor * 10])
        low = math.floor(math.log10(bottom))
        high = max(math.ceil(math.log10(top)), low + 1)
        return cls(count=len(errors), floor=floor, low=low, high=high)

    def x(self, index: int) -> float:
        """Horizontal position of comparison ``index`` (centred in its slot)."""
        width = _WIDTH - _LEFT - _RIGHT
        return _LEFT + (index + 0.5) * width / max(self.count, 1)

    def y(self, error: float | None) -> float:
        """Vertical position of an error; zeros at the floor, no figure at the top."""
        if not _drawable(error):
            return self.y_of_exponent(self.high)
        return self.y_of_exponent(math.log10(max(error, self.floor)))

    def y_of_exponent(self, exponent: float) -> float:
        """Vertical position of ``10 ** exponent``."""
        height = _HEIGHT - _TOP - _BOTTOM
        return _TOP + (self.high - exponent) * height / (self.high - self.low)


def _drawable(error: float | None) -> bool:
    """Whether an error has a finite figure to plot."""
    return error is not None and math.isfinite(error)


def chart_section(report: Report) -> str:
    """The error-versus-depth chart, or why there is none."""
    if not report.comparisons:
        content = element("p", "No intermediate value could be aligned, so there is no chart.",
                          class_="muted")
    else:
        scale = _Scale.for_errors([record.figures.max_abs_error for record in report.comparisons],
                                  report.atol)
        content = _chart(report, scale) + _chart_legend(report, scale)
    return section("error along the graph", content, id_="chart")


def _chart(report: Report, scale: _Scale) -> str:
    """The inline SVG: grid, atol line, error trace, points and the first divergence."""
    records = report.comparisons
    layers = [
        _y_axis(scale),
        _x_axis(scale),
        _tolerance_band(scale, report.atol),
        _trace(scale, records),
        _culprit_mark(scale, report),
        "".join(_point(scale, record) for record in records),
    ]
    return element("svg", "".join(layers), viewBox=f"0 0 {_WIDTH} {_HEIGHT}", role="img",
                   aria_label="max abs error of each comparison, log scale", class_="chart")


def _y_axis(scale: _Scale) -> str:
    """Decade grid lines labelled as powers of ten, and the axis title."""
    step = math.ceil((scale.high - scale.low) / _MAX_DECADE_LABELS)
    parts = []
    for exponent in range(scale.low, scale.high + 1, step):
        y = _fmt(scale.y_of_exponent(exponent))
        parts.append(element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=y, y2=y, class_="grid"))
        parts.append(element("text", _power_of_ten(exponent), x=_LEFT - 8, y=y,
                             class_="tick", text_anchor="end", dominant_baseline="middle"))
    parts.append(element("text", "max abs error (log scale)", x=14, y=_fmt(_HEIGHT / 2),
                         class_="axis-title", text_anchor="middle",
                         transform=f"rotate(-90 14 {_fmt(_HEIGHT / 2)})"))
    return "".join(parts)


def _power_of_ten(exponent: int) -> str:
    """``10`` with a superscript exponent, as SVG text content."""
    sign = "−" if exponent < 0 else ""
    return "10" + element("tspan", escaped(f"{sign}{abs(exponent)}"), dy="-7", class_="exponent")


def _x_axis(scale: _Scale) -> str:
    """The baseline, comparison indices and the axis title."""
    bottom = _HEIGHT - _BOTTOM
    parts = [element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=bottom, y2=bottom, class_="axis")]
    for index in range(0, scale.count, _index_step(scale.count)):
        parts.append(element("text", escaped(index), x=_fmt(scale.x(index)), y=bottom + 16,
                             class_="tick", text_anchor="middle"))
    parts.append(element("text", "comparison (topological order)", x=_fmt(_WIDTH / 2),
                         y=_HEIGHT - 6, class_="axis-title", text_anchor="middle"))
    return "".join(parts)


def _index_step(count: int) -> int:
    """A round step (1, 2, 5, 10, 20, ...) that labels at most a dozen indices."""
    magnitude = 1
    while True:
        for multiple in (1, 2, 5):
            if count <= _MAX_INDEX_LABELS * multiple * magnitude:
                return multiple * magnitude
        magnitude *= 10


def _tolerance_band(scale: _Scale, atol: float) -> str:
    """A shaded band below atol and the atol line, labelled."""
    if atol <= 0:
        return ""
    y = scale.y_of_exponent(math.log10(atol))
    band = element("rect", x=_LEFT, y=_fmt(y), width=_WIDTH - _LEFT - _RIGHT,
                   height=_fmt(_HEIGHT - _BOTTOM - y), class_="band")
    line = element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=_fmt(y), y2=_fmt(y), class_="atol")
    label = element("text", escaped(f"atol = {atol:g}"), x=_WIDTH - _RIGHT - 4, y=_fmt(y - 5),
                    class_="atol-label", text_anchor="end")
    return band + line + label


def _trace(scale: _Scale, records: Sequence[Record]) -> str:
    """A thin line through the points, so the error's growth reads at a glance."""
    points = " ".join(f"{_fmt(scale.x(r.index))},{_fmt(scale.y(r.figures.max_abs_error))}"
                      for r in records)
    return element("polyline", points=points, class_="trace")


def _point(scale: _Scale, record: Record) -> str:
    """One comparison's dot, coloured by status, with a hover title and a link to its row."""
    classes = ["point", "fail" if record.failed else "pass"]
    if not _drawable(record.figures.max_abs_error):
        classes.append("no-figure")
    dot = element("circle", element("title", escaped(_point_title(record))),
                  cx=_fmt(scale.x(record.index)), cy=_fmt(scale.y(record.figures.max_abs_error)),
                  r=4, class_=" ".join(classes))
    return element("a", dot, href=f"#row-{record.index}")


def _point_title(record: Record) -> str:
    """The hover text of a point: which value, and its error."""
    error = record.figures.max_abs_error
    if error == 0:
        figure = "0 (drawn at the chart's floor)"
    elif not _drawable(error):
        figure = f"{format_number(error)} (no finite figure; drawn at the top)"
    else:
        figure = format_number(error)
    return (f"#{record.index} {module_label(record)}\n"
            f"ONNX node {record.onnx_node or record.onnx_value} ({record.onnx_op or '?'})\n"
            f"max abs {figure}, {record.figures.status}")


def marked_record(report: Report) -> tuple[str, Record, Record] | None:
    """What the chart marks: what to call it, its row on the chart, the record it names.

    The culprit, else the first divergence, else (at parity) the first hidden
    divergence, whichever is on the chart first. A culprit found inside a fused kernel
    is no row of its own: it is marked at the kernel's row, named as itself (the module
    the verdict names). ``None`` when there is nothing to mark.
    """
    candidates = [("culprit", report.culprit), ("first divergence", report.first_divergence),
                  ("hidden divergence", next(iter(report.hidden_divergences), None))]
    for what, record in candidates:
        row = _row_of(report, record)
        if row is not None:
            return what, row, record
    return None


def _row_of(report: Report, record: Record | None) -> Record | None:
    """The chart's row for ``record``: itself, or the fused kernel's output it lies inside."""
    if record is None:
        return None
    if any(row is record for row in report.comparisons):
        return record
    kernel = (report.attribution.inside_kernel if report.attribution else None) or {}
    if record is not report.culprit or kernel.get("value") != record.onnx_value:
        return None
    return next((row for row in report.comparisons
                 if row.onnx_value == kernel.get("kernel_output")), None)


def _culprit_mark(scale: _Scale, report: Report) -> str:
    """A dashed guide, a ring and a label at the marked record, when there is one."""
    marked = marked_record(report)
    if marked is None:
        return ""
    what, row, named = marked
    x = scale.x(row.index)
    y = scale.y(row.figures.max_abs_error)
    guide = element("line", x1=_fmt(x), x2=_fmt(x), y1=_TOP - 12, y2=_HEIGHT - _BOTTOM,
                    class_="culprit-guide")
    ring = element("circle", cx=_fmt(x), cy=_fmt(y), r=9, class_="culprit-ring")
    on_right = x > _WIDTH / 2
    label = element("text", escaped(f"{what}: {module_label(named)}"),
                    x=_fmt(x - 6 if on_right else x + 6), y=_TOP - 14, class_="culprit-label",
                    text_anchor="end" if on_right else "start")
    return element("g", guide + ring + label, id="chart-culprit")


def _chart_legend(report: Report, scale: _Scale) -> str:
    """How to read the chart, including the cases the dots cannot show."""
    notes = [
        element("span", "●", class_="swatch pass") + " pass",
        element("span", "●", class_="swatch fail") + " fail",
        escaped(f"an element fails when {TOLERANCE_RULE}, so a dot above the atol line can "
                "still pass"),
    ]
    errors = [record.figures.max_abs_error for record in report.comparisons]
    if 0 in errors:
        notes.append(escaped(f"exact zeros are drawn at {scale.floor:g}"))
    if not all(_drawable(error) for error in errors):
        notes.append(escaped("hollow dots at the top have no finite error (shape or dtype "
                             "mismatch, NaN or Inf)"))
    notes.append(escaped("hover a dot for its figures, click it for its row"))
    if report.first_divergence is not None and marked_record(report) is None:
        notes.append(escaped("the first divergence is a final output, not an aligned "
                             "intermediate value, so it is not on this chart"))
    return element("p", " · ".join(notes), class_="legend")


def _fmt(value: float) -> str:
    """A coordinate with one decimal, enough for a 960-unit-wide chart."""
    return f"{value:.1f}"
