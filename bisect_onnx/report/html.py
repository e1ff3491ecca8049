"""The self-contained HTML report: verdict, error chart, tables, the culprit's neighbourhood.

One file with inline CSS, an inline SVG chart and a little vanilla JavaScript, so it opens
with no network. Every figure comes from the report's records, the same ones the terminal
table and the JSON file format; every string from them is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_onnx.errors import InputError
from bisect_onnx.graph.provenance import SourceLocation, short_op
from bisect_onnx.judge.records import Record, Report
from bisect_onnx.report.text import (
    format_number,
    format_rounded_up,
    format_shape,
    format_source,
    group_not_compared,
)

__all__ = ["render_html", "write_html"]

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
_VOID_ELEMENTS = frozenset({"input", "meta"})
_VALUE_SOURCES = {
    "reference": "compared against PyTorch",
    "initializer": "a weight stored in the ONNX file",
    "graph_input": "an input of the model",
    "candidate": "computed by ONNX Runtime only",
}
_RULE = "|onnx − torch| > atol + rtol · |torch|"


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    body = "".join([
        _verdict_section(report),
        _figures_section(report),
        _chart_section(report),
        _culprit_section(report),
        _comparisons_section(report),
        _outputs_section(report),
        _not_compared_section(report),
    ])
    title = "bisect-onnx: " + report.summary().partition(":")[0]
    if report.first_divergence is not None:
        title += " at " + _module(report.first_divergence)
    return _page(title, _element("main", body))


def write_html(report: Report, path: Path) -> None:
    """Write the HTML report to ``path``, a file the user named."""
    try:
        Path(path).write_text(render_html(report), encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the HTML report to {path}: {error.strerror}; "
                         "choose a writable path for --html") from error


# --- markup helpers -------------------------------------------------------------------------


def _text(value: object) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def _element(tag: str, content: str = "", **attributes: object) -> str:
    """``<tag ...>content</tag>``; ``content`` is HTML already, attribute values are escaped.

    A trailing underscore is dropped from an attribute name (``class_``) and other
    underscores become hyphens (``data_sort``); ``None`` and ``False`` leave it out.
    """
    parts = [tag]
    for name, value in attributes.items():
        if value is None or value is False:
            continue
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{_text(value)}"')
    opening = "<" + " ".join(parts) + ">"
    return opening if tag in _VOID_ELEMENTS else f"{opening}{content}</{tag}>"


def _section(title: str, content: str, *, id_: str) -> str:
    """A titled section of the page."""
    return _element("section", _element("h2", _text(title)) + content, id=id_)


def _definitions(items: Iterable[tuple[str, str]]) -> str:
    """A ``<dl>`` of label and HTML value pairs."""
    rows = "".join(_element("dt", _text(label)) + _element("dd", value) for label, value in items)
    return _element("dl", rows) if rows else _element("p", "(none recorded)", class_="muted")


def _mapping(data: Mapping[str, Any]) -> str:
    """A dict of the report (environment, reference, candidate) as a definition list."""
    return _definitions((key.replace("_", " "), _text(value)) for key, value in data.items())


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], **attributes: object) -> str:
    """A plain table; ``rows`` hold cells that are HTML already."""
    head = _element("thead", _element("tr", "".join(_element("th", _text(h)) for h in headers)))
    body = "".join(_element("tr", "".join(_element("td", cell) for cell in row)) for row in rows)
    return _element("table", head + _element("tbody", body), **attributes)


def _page(title: str, body: str) -> str:
    """The HTML document around ``body``, with the inline style and script."""
    head = "".join([
        _element("meta", charset="utf-8"),
        _element("meta", name="viewport", content="width=device-width, initial-scale=1"),
        _element("title", _text(title)),
        _element("style", _CSS),
    ])
    document = _element("head", head) + _element("body", body + _element("script", _SCRIPT))
    return "<!DOCTYPE html>\n" + _element("html", document, lang="en") + "\n"


# --- verdict, figures ----------------------------------------------------------------------


def _verdict_section(report: Report) -> str:
    """The verdict line, then the warnings and the note."""
    headline, _, rest = report.summary().partition(":")
    verdict = _element("p", _element("strong", _text(headline)) + _text(":" + rest),
                       class_="verdict " + ("diverged" if report.diverged else "parity"))
    parts = [_element("h1", "bisect-onnx report"), verdict]
    if report.warnings:
        items = "".join(_element("li", _text(warning)) for warning in report.warnings)
        parts.append(_element("ul", items, class_="warnings"))
    if report.note:
        parts.append(_element("p", _element("strong", "note: ") + _text(report.note),
                              class_="note"))
    return _element("header", "".join(parts))


def _figures_section(report: Report) -> str:
    """Tolerances, coverage, environment and the two models side by side."""
    cards = [
        ("tolerances", _tolerances(report)),
        ("coverage", _coverage(report)),
        ("environment", _mapping(report.environment)),
        ("PyTorch side", _mapping(report.reference)),
        ("ONNX side", _mapping(report.candidate)),
    ]
    return _element("section", "".join(
        _element("div", _element("h3", _text(title)) + content, class_="card")
        for title, content in cards
    ), class_="cards", id="figures")


def _tolerances(report: Report) -> str:
    """rtol, atol and the rule they define."""
    figures = _definitions([("rtol", _text(f"{report.rtol:g}")),
                            ("atol", _text(f"{report.atol:g}"))])
    rule = _element("p", _text(f"an element fails when {_RULE}"), class_="muted small")
    return figures + rule


def _coverage(report: Report) -> str:
    """How much of each side was compared."""
    coverage = report.coverage
    rows = [
        ("granularity", _text(coverage.granularity)),
        ("values compared", _of(coverage.aligned_values, coverage.onnx_values)),
        ("module calls", _of(coverage.aligned_modules, coverage.torch_modules)),
        ("nodes attributed", _of(coverage.attributed_nodes, coverage.onnx_nodes)),
    ]
    if coverage.torch_ops:
        rows += [("torch ops compared", _of(coverage.compared_ops, coverage.torch_ops)),
                 ("ops fused", _text(coverage.fused_ops)),
                 ("op-named float values compared",
                  _of(coverage.fx_named_compared, coverage.fx_named_values))]
    rows += [("hidden divergences", _text(len(report.hidden_divergences))),
             ("not compared", _text(len(report.unaligned) + len(report.onnx_unaligned)))]
    return _definitions(rows)


def _of(part: int, whole: int) -> str:
    """``part of whole`` as HTML."""
    return _text(f"{part} of {whole}")


# --- the chart -----------------------------------------------------------------------------


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


def _chart_section(report: Report) -> str:
    """The error-versus-depth chart, or why there is none."""
    if not report.comparisons:
        content = _element("p", "No intermediate value could be aligned, so there is no chart.",
                           class_="muted")
    else:
        scale = _Scale.for_errors([record.max_abs_error for record in report.comparisons],
                                  report.atol)
        content = _chart(report, scale) + _chart_legend(report, scale)
    return _section("error along the graph", content, id_="chart")


def _chart(report: Report, scale: _Scale) -> str:
    """The inline SVG: grid, atol line, error trace, points and the first divergence."""
    records = report.comparisons
    layers = [
        _y_axis(scale),
        _x_axis(scale),
        _tolerance_band(scale, report.atol),
        _trace(scale, records),
        _first_divergence_mark(scale, report),
        "".join(_point(scale, record) for record in records),
    ]
    return _element("svg", "".join(layers), viewBox=f"0 0 {_WIDTH} {_HEIGHT}", role="img",
                    aria_label="max abs error of each comparison, log scale", class_="chart")


def _y_axis(scale: _Scale) -> str:
    """Decade grid lines labelled as powers of ten, and the axis title."""
    step = math.ceil((scale.high - scale.low) / _MAX_DECADE_LABELS)
    parts = []
    for exponent in range(scale.low, scale.high + 1, step):
        y = _fmt(scale.y_of_exponent(exponent))
        parts.append(_element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=y, y2=y, class_="grid"))
        parts.append(_element("text", _power_of_ten(exponent), x=_LEFT - 8, y=y,
                              class_="tick", text_anchor="end", dominant_baseline="middle"))
    parts.append(_element("text", "max abs error (log scale)", x=14, y=_fmt(_HEIGHT / 2),
                          class_="axis-title", text_anchor="middle",
                          transform=f"rotate(-90 14 {_fmt(_HEIGHT / 2)})"))
    return "".join(parts)


def _power_of_ten(exponent: int) -> str:
    """``10`` with a superscript exponent, as SVG text content."""
    sign = "−" if exponent < 0 else ""
    return "10" + _element("tspan", _text(f"{sign}{abs(exponent)}"), dy="-7", class_="exponent")


def _x_axis(scale: _Scale) -> str:
    """The baseline, comparison indices and the axis title."""
    bottom = _HEIGHT - _BOTTOM
    parts = [_element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=bottom, y2=bottom, class_="axis")]
    for index in range(0, scale.count, _index_step(scale.count)):
        parts.append(_element("text", _text(index), x=_fmt(scale.x(index)), y=bottom + 16,
                              class_="tick", text_anchor="middle"))
    parts.append(_element("text", "comparison (topological order)", x=_fmt(_WIDTH / 2),
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
    band = _element("rect", x=_LEFT, y=_fmt(y), width=_WIDTH - _LEFT - _RIGHT,
                    height=_fmt(_HEIGHT - _BOTTOM - y), class_="band")
    line = _element("line", x1=_LEFT, x2=_WIDTH - _RIGHT, y1=_fmt(y), y2=_fmt(y), class_="atol")
    label = _element("text", _text(f"atol = {atol:g}"), x=_WIDTH - _RIGHT - 4, y=_fmt(y - 5),
                     class_="atol-label", text_anchor="end")
    return band + line + label


def _trace(scale: _Scale, records: Sequence[Record]) -> str:
    """A thin line through the points, so the error's growth reads at a glance."""
    points = " ".join(f"{_fmt(scale.x(r.index))},{_fmt(scale.y(r.max_abs_error))}"
                      for r in records)
    return _element("polyline", points=points, class_="trace")


def _point(scale: _Scale, record: Record) -> str:
    """One comparison's dot, coloured by status, with a hover title and a link to its row."""
    classes = ["point", "fail" if record.failed else "pass"]
    if not _drawable(record.max_abs_error):
        classes.append("no-figure")
    dot = _element("circle", _element("title", _text(_point_title(record))),
                   cx=_fmt(scale.x(record.index)), cy=_fmt(scale.y(record.max_abs_error)),
                   r=4, class_=" ".join(classes))
    return _element("a", dot, href=f"#row-{record.index}")


def _point_title(record: Record) -> str:
    """The hover text of a point: which value, and its error."""
    error = record.max_abs_error
    if error == 0:
        figure = "0 (drawn at the chart's floor)"
    elif not _drawable(error):
        figure = f"{format_number(error)} (no finite figure; drawn at the top)"
    else:
        figure = format_number(error)
    return (f"#{record.index} {_module(record)}\n"
            f"ONNX node {record.onnx_node or record.onnx_value} ({record.onnx_op or '?'})\n"
            f"max abs {figure}, {record.status}")


def _first_divergence_mark(scale: _Scale, report: Report) -> str:
    """A dashed guide, a ring and a label at the first divergence, when it is on the chart."""
    first = report.first_divergence
    if first is None or not any(record is first for record in report.comparisons):
        return ""
    x = scale.x(first.index)
    y = scale.y(first.max_abs_error)
    guide = _element("line", x1=_fmt(x), x2=_fmt(x), y1=_TOP - 12, y2=_HEIGHT - _BOTTOM,
                     class_="culprit-guide")
    ring = _element("circle", cx=_fmt(x), cy=_fmt(y), r=9, class_="culprit-ring")
    on_right = x > _WIDTH / 2
    label = _element("text", _text(f"first divergence: {_module(first)}"),
                     x=_fmt(x - 6 if on_right else x + 6), y=_TOP - 14, class_="culprit-label",
                     text_anchor="end" if on_right else "start")
    return _element("g", guide + ring + label, id="chart-first-divergence")


def _chart_legend(report: Report, scale: _Scale) -> str:
    """How to read the chart, including the cases the dots cannot show."""
    notes = [
        _element("span", "●", class_="swatch pass") + " pass",
        _element("span", "●", class_="swatch fail") + " fail",
        _text(f"an element fails when {_RULE}, so a dot above the atol line can still pass"),
    ]
    errors = [record.max_abs_error for record in report.comparisons]
    if 0 in errors:
        notes.append(_text(f"exact zeros are drawn at {scale.floor:g}"))
    if not all(_drawable(error) for error in errors):
        notes.append(_text("hollow dots at the top have no finite error (shape or dtype "
                           "mismatch, NaN or Inf)"))
    notes.append(_text("hover a dot for its figures, click it for its row"))
    first = report.first_divergence
    if first is not None and not any(record is first for record in report.comparisons):
        notes.append(_text("the first divergence is a final output, not an aligned "
                           "intermediate value, so it is not on this chart"))
    return _element("p", " · ".join(notes), class_="legend")


def _fmt(value: float) -> str:
    """A coordinate with one decimal, enough for a 960-unit-wide chart."""
    return f"{value:.1f}"


# --- the tables ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    """One column of the record tables: its header, cell text and sort key."""

    title: str
    cell: Callable[[Record], str]
    sort_key: Callable[[Record], str]
    numeric: bool = False
    status: bool = False
    """Whether the cell is coloured by the record's status."""


def _torch_op(record: Record) -> str:
    """The ATen op and its FX node, at op level."""
    if record.fx_node is None:
        return record.torch_op or ""
    return f"{short_op(record.torch_op or '')} ({record.fx_node})"


def _module(record: Record) -> str:
    """The torch module, or which final output the record is."""
    return record.torch_module if record.torch_module is not None else f"(output {record.index})"


def _shape_text(record: Record) -> str:
    """The shape, with the ONNX shape beside it when they differ."""
    shape = format_shape(record.shape)
    if record.candidate_shape != record.shape:
        shape += f" vs {format_shape(record.candidate_shape)}"
    return shape


def _fraction(value: float | None) -> str:
    """A mismatch fraction as a percentage."""
    return "-" if value is None else f"{value:.1%}"


def _passing_atol(value: float | None) -> str:
    """The smallest atol that would pass, rounded up as the text report advises it."""
    return "-" if value is None else format_rounded_up(value)


def _sort_number(value: float | None) -> str:
    """A number as JavaScript's ``parseFloat`` reads it; no figure sorts as the worst."""
    if value is None or math.isnan(value):
        return "Infinity"
    return repr(value).replace("inf", "Infinity")


_COLUMNS = (
    _Column("#", lambda r: str(r.index), lambda r: str(r.index), numeric=True),
    _Column("torch op", _torch_op, _torch_op),
    _Column("torch module", _module, _module),
    _Column("ONNX node", lambda r: r.onnx_node or r.onnx_value,
            lambda r: r.onnx_node or r.onnx_value),
    _Column("op", lambda r: r.onnx_op or "", lambda r: r.onnx_op or ""),
    _Column("shape", _shape_text, _shape_text),
    _Column("max abs", lambda r: format_number(r.max_abs_error),
            lambda r: _sort_number(r.max_abs_error), numeric=True),
    _Column("max rel", lambda r: format_number(r.max_rel_error),
            lambda r: _sort_number(r.max_rel_error), numeric=True),
    _Column("mismatch", lambda r: _fraction(r.mismatch_fraction),
            lambda r: _sort_number(r.mismatch_fraction), numeric=True),
    _Column("min passing atol", lambda r: _passing_atol(r.min_passing_atol),
            lambda r: _sort_number(r.min_passing_atol), numeric=True),
    _Column("status", lambda r: r.status, lambda r: r.status, status=True),
)


def _records_table(records: Sequence[Record], first: Record | None, *, table_id: str,
                   row_prefix: str) -> str:
    """Records as a sortable table; the first divergence's row is highlighted."""
    head = "".join(_element("th", _text(column.title), data_type="number" if column.numeric
                            else "text", title="click to sort") for column in _COLUMNS)
    rows = "".join(_record_row(record, marked=record is first, row_id=f"{row_prefix}{record.index}")
                   for record in records)
    return _element("table", _element("thead", _element("tr", head)) + _element("tbody", rows),
                    id=table_id, class_="records sortable")


def _record_row(record: Record, *, marked: bool, row_id: str) -> str:
    """One record's row."""
    cells = "".join(
        _element("td", _text(column.cell(record)), data_sort=column.sort_key(record),
                 class_=f"status-{record.status}" if column.status else None)
        for column in _COLUMNS
    )
    classes = ["fail" if record.failed else "pass"] + (["first-divergence"] if marked else [])
    return _element("tr", cells, id=row_id, class_=" ".join(classes),
                    title="first divergence" if marked else None)


def _comparisons_section(report: Report) -> str:
    """Every aligned comparison, sortable and filterable."""
    if not report.comparisons:
        content = _element("p", "No intermediate value could be aligned.", class_="muted")
        return _section("comparisons", content, id_="comparisons-section")
    table = _records_table(report.comparisons, report.first_divergence, table_id="comparisons",
                           row_prefix="row-")
    return _section("comparisons (topological order)",
                    _filter_controls(len(report.comparisons)) + table, id_="comparisons-section")


def _filter_controls(count: int) -> str:
    """The filter box over the comparison table and its count of rows shown."""
    box = _element("input", type="search", id="filter",
                   placeholder="filter rows: module, node, op, status…",
                   aria_label="filter the comparison rows")
    shown = _element("span", _text(f"{count} of {count} rows"), id="filter-count",
                     class_="muted")
    return _element("div", box + shown, class_="controls")


def _outputs_section(report: Report) -> str:
    """The final outputs, which decide the verdict."""
    table = _records_table(report.final_outputs, report.first_divergence, table_id="outputs",
                           row_prefix="output-")
    return _section("final outputs", table, id_="outputs-section")


def _not_compared_section(report: Report) -> str:
    """Values of either side with no counterpart, grouped by reason."""
    groups = group_not_compared(report)
    if not groups:
        return ""
    content = _element("ul", "".join(
        _element("li", _element("p", _text(f"{why}:"))
                 + _element("p", ", ".join(_element("code", _text(name)) for name in names)))
        for why, names in groups
    ), class_="reasons")
    count = sum(len(names) for _, names in groups)
    what = "values" if report.coverage.granularity == "op" else "module outputs"
    return _section(f"not compared ({count} {what})", content, id_="not-compared")


# --- the culprit ---------------------------------------------------------------------------


def _culprit_section(report: Report) -> str:
    """The first divergence's ONNX node in its graph, or why there is none to show."""
    culprit = report.culprit
    if culprit is None:
        return _section("culprit", _element("p", _text(_no_culprit_reason(report)),
                                             class_="muted"), id_="culprit")
    parts = [
        _definitions(_culprit_facts(culprit, report.first_culprit or report.first_divergence,
                                    report.attribution)),
        _element("h3", "attributes"),
        _attributes_table(culprit.get("attributes") or {}),
        _element("h3", "inputs"),
        _values_table(culprit.get("inputs") or []),
        _element("h3", "outputs"),
        _values_table(culprit.get("outputs") or []),
    ]
    return _section("culprit: " + str(culprit.get("node")), "".join(parts), id_="culprit")


def _no_culprit_reason(report: Report) -> str:
    """Why the report has no culprit neighbourhood."""
    if not report.diverged:
        return "No divergence in the final outputs, so there is no culprit."
    return ("The first divergence has no ONNX node to show (a final output that no node "
            "produces, or a node missing from the graph).")


def _culprit_facts(culprit: Mapping[str, Any], first: Record | None,
                   attribution: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Node, op, torch side and source of the culprit, as label and HTML pairs."""
    source = culprit.get("source")
    location = format_source(SourceLocation(source["file"], source["line"])) if source else "-"
    op = f"{culprit.get('op_type')} ({culprit.get('domain')})"
    return [
        ("ONNX node", _element("code", _text(culprit.get("node")))),
        ("op type", _text(op)),
        ("torch module", _element("code", _text(culprit.get("torch_module") or "-"))),
        ("torch op", _element("code", _text(culprit.get("torch_op") or "-"))),
        ("source", _element("code", _text(location))),
        ("introduced here", _text(_introduced(first))),
        ("classification", _text(_classification(first, attribution))),
    ]


def _introduced(first: Record | None) -> str:
    """Whether the divergence starts at this node, as the local check found."""
    introduced = first.introduced_here if first is not None else None
    if introduced is None:
        return "not checked"
    if introduced:
        return (f"yes: fed PyTorch's inputs, it is still off by "
                f"{format_number(first.local_max_abs_error)}")
    return "no: fed PyTorch's inputs it is within tolerance; the error reaches it from upstream"


def _classification(first: Record | None, attribution: Mapping[str, Any] | None) -> str:
    """Which side is wrong, from the float64 reruns."""
    attribution = attribution or {}
    found = attribution.get("classification")
    culprit_values = {attribution.get("first_culprit"),
                      (attribution.get("inside_kernel") or {}).get("value")}
    if first is None or not found or first.onnx_value not in culprit_values:
        return "-"
    return f"{found['kind']}: {found['detail']}; {found['file_with']}"


def _attributes_table(attributes: Mapping[str, Any]) -> str:
    """The node's attributes, one row each."""
    if not attributes:
        return _element("p", "(none)", class_="muted")
    rows = [[_element("code", _text(name)), _element("code", _text(value))]
            for name, value in attributes.items()]
    return _table(["name", "value"], rows, class_="plain")


def _values_table(values: Sequence[Mapping[str, Any]]) -> str:
    """Inputs or outputs of the node: name, shape, dtype and where the value came from."""
    if not values:
        return _element("p", "(none)", class_="muted")
    rows = []
    for value in values:
        shape = value.get("shape")
        source = str(value.get("source"))
        meaning = _VALUE_SOURCES.get(source)
        rows.append([
            _element("code", _text(value.get("name"))),
            _text(format_shape(shape) if shape is not None else "-"),
            _text(value.get("dtype") or "-"),
            _text(f"{source}: {meaning}" if meaning else source),
        ])
    return _table(["name", "shape", "dtype", "source"], rows, class_="plain")


# --- style and behaviour -------------------------------------------------------------------

_CSS = """
:root { --pass: #1a7f37; --fail: #cf222e; --mark: #fff3c4; --line: #d0d7de; --muted: #57606a; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1f2328; background: #f6f8fa; }
main { max-width: 1200px; margin: 0 auto; padding: 20px 24px 48px; }
h1 { font-size: 20px; margin: 0 0 10px; }
h2 { font-size: 16px; margin: 28px 0 10px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }
h3 { font-size: 13px; margin: 14px 0 6px; text-transform: uppercase; letter-spacing: .04em;
     color: var(--muted); }
code, td { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
           font-size: 12.5px; }
.verdict { padding: 12px 14px; border-radius: 6px; border-left: 6px solid; background: #fff;
           word-break: break-word; }
.verdict.diverged { border-color: var(--fail); }
.verdict.parity { border-color: var(--pass); }
.verdict.diverged strong { color: var(--fail); }
.verdict.parity strong { color: var(--pass); }
.warnings { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px;
            padding: 8px 8px 8px 28px; }
.note { background: #ddf4ff; border-radius: 6px; padding: 8px 12px; }
.muted { color: var(--muted); }
.small { font-size: 12px; margin: 6px 0 0; }
.reasons { list-style: none; padding: 0; }
.reasons li { background: #fff; border: 1px solid var(--line); border-radius: 6px;
              padding: 6px 12px; margin-bottom: 8px; }
.reasons p { margin: 2px 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 12px;
         align-items: start; margin-top: 16px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 4px 12px 10px;
        overflow-wrap: anywhere; }
.card dl { margin: 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
dt { color: var(--muted); }
dd { margin: 0; }
.chart { width: 100%; height: auto; background: #fff; border: 1px solid var(--line);
         border-radius: 6px; }
.chart .grid { stroke: #eaeef2; }
.chart .axis { stroke: #8c959f; }
.chart .tick { font-size: 12px; fill: var(--muted); }
.chart .exponent { font-size: 9px; }
.chart .axis-title { font-size: 12px; fill: var(--muted); }
.chart .band { fill: var(--pass); opacity: .06; }
.chart .atol { stroke: var(--pass); stroke-width: 1.5; stroke-dasharray: 6 4; }
.chart .atol-label { font-size: 12px; fill: var(--pass); }
.chart .trace { fill: none; stroke: #8c959f; stroke-width: 1; }
.chart .point { stroke: #fff; stroke-width: 1; }
.chart .point.pass { fill: var(--pass); }
.chart .point.fail { fill: var(--fail); }
.chart .point.no-figure { fill: #fff; stroke: var(--fail); stroke-width: 2; }
.chart a:hover .point { stroke: #1f2328; stroke-width: 2; }
.chart .culprit-guide { stroke: var(--fail); stroke-dasharray: 3 3; }
.chart .culprit-ring { fill: none; stroke: var(--fail); stroke-width: 2; }
.chart .culprit-label { font-size: 12px; font-weight: 600; fill: var(--fail); }
.legend { color: var(--muted); font-size: 12px; }
.swatch.pass { color: var(--pass); }
.swatch.fail { color: var(--fail); }
.controls { display: flex; gap: 12px; align-items: center; margin-bottom: 8px; }
.controls input { width: 320px; padding: 5px 8px; border: 1px solid var(--line);
                  border-radius: 6px; font: inherit; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
table.records { width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eaeef2; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; white-space: nowrap; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th:hover { background: #eaeef2; }
th[aria-sort="ascending"]::after { content: " ▲"; }
th[aria-sort="descending"]::after { content: " ▼"; }
td { overflow-wrap: anywhere; }
tr.first-divergence td { background: var(--mark); font-weight: 600; }
tr:target td { outline: 2px solid #0969da; outline-offset: -2px; }
.status-pass { color: var(--pass); }
td[class^="status-"]:not(.status-pass) { color: var(--fail); font-weight: 600; }
"""

_SCRIPT = """
(function () {
  function compare(a, b, numeric) {
    if (numeric) { a = parseFloat(a); b = parseFloat(b); return a < b ? -1 : a > b ? 1 : 0; }
    return a.localeCompare(b);
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.querySelectorAll("th");
    headers.forEach(function (header, column) {
      header.addEventListener("click", function () {
        var ascending = header.getAttribute("aria-sort") !== "ascending";
        var numeric = header.dataset.type === "number";
        headers.forEach(function (other) { other.removeAttribute("aria-sort"); });
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (x, y) {
          var order = compare(x.cells[column].dataset.sort, y.cells[column].dataset.sort, numeric);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  var filter = document.getElementById("filter");
  if (filter) {
    filter.addEventListener("input", function () {
      var query = filter.value.toLowerCase();
      var rows = document.getElementById("comparisons").tBodies[0].rows;
      var shown = 0;
      Array.prototype.forEach.call(rows, function (row) {
        var match = row.textContent.toLowerCase().indexOf(query) !== -1;
        row.hidden = !match;
        if (match) { shown += 1; }
      });
      document.getElementById("filter-count").textContent =
        shown + " of " + rows.length + " rows";
    });
  }
})();
"""
