"""The HTML report's record tables: comparisons, final outputs, and what was not compared.

The record tables sort by any column (the page's script reads each cell's ``data-sort``)
and the comparison table filters by text; the first divergence's and the culprit's rows
are highlighted. Figures, op types, shapes and statuses never wrap (``2.48e+01`` and
``ReduceSum`` stay whole); module paths and node names wrap after their separators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bisect_onnx.graph.provenance import short_op
from bisect_onnx.report.formatting import (
    format_number,
    format_record_shape,
    format_rounded_up,
)
from bisect_onnx.report.html_markup import breakable, element, escaped, module_label, section
from bisect_onnx.report.text import group_not_compared

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["comparisons_section", "not_compared_section", "outputs_section", "records_table"]


@dataclass(frozen=True)
class _Column:
    """One column of the record tables: its header, cell text and sort key."""

    title: str
    cell: Callable[[Record], str]
    sort_key: Callable[[Record], str]
    numeric: bool = False
    status: bool = False
    """Whether the cell is coloured by the record's status."""
    name: bool = False
    """A long name that may wrap after its separators; other cells never wrap."""
    width: str | None = None
    """A cell that never wraps: the width its longest usual text takes (the names share
    the rest, so that the table fits the page and its status column stays in view)."""


def _torch_op(record: Record) -> str:
    """The ATen op and its FX node, at op level."""
    if record.fx_node is None:
        return record.torch_op or ""
    return f"{short_op(record.torch_op or '')} ({record.fx_node})"


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


# Widths in characters of the page's font: a figure is 8 ("7.36e-03"), a status up to 14
# ("shape_mismatch"), an op type usually under 16; a longer one overflows into its gutter.
_FIGURE = "9ch"
_COLUMNS = (
    _Column("#", lambda r: str(r.index), lambda r: str(r.index), numeric=True, width="5ch"),
    _Column("torch op", _torch_op, _torch_op, name=True),
    _Column("torch module", module_label, module_label, name=True),
    _Column("ONNX node", lambda r: r.onnx_node or r.onnx_value,
            lambda r: r.onnx_node or r.onnx_value, name=True),
    _Column("op", lambda r: r.onnx_op or "", lambda r: r.onnx_op or "", width="16ch"),
    _Column("shape", format_record_shape, format_record_shape, width="15ch"),
    _Column("max abs", lambda r: format_number(r.figures.max_abs_error),
            lambda r: _sort_number(r.figures.max_abs_error), numeric=True, width=_FIGURE),
    _Column("max rel", lambda r: format_number(r.figures.max_rel_error),
            lambda r: _sort_number(r.figures.max_rel_error), numeric=True, width=_FIGURE),
    _Column("mismatch", lambda r: _fraction(r.figures.mismatch_fraction),
            lambda r: _sort_number(r.figures.mismatch_fraction), numeric=True, width=_FIGURE),
    _Column("min passing atol", lambda r: _passing_atol(r.figures.min_passing_atol),
            lambda r: _sort_number(r.figures.min_passing_atol), numeric=True, width=_FIGURE),
    _Column("status", lambda r: r.figures.status, lambda r: r.figures.status, status=True,
            width="16ch"),
)


def records_table(records: Sequence[Record], report: Report, *, table_id: str,
                  row_prefix: str, hidden_hint: str | None = None,
                  last_index: int | None = None) -> str:
    """Records as a sortable table; the first divergence's and the culprit's rows marked.

    With ``hidden_hint``, where the records skip indices (a window of a long table, up
    to ``last_index``), a row says how many are hidden and, in the hint, how to see them.
    """
    head = "".join(element("th", escaped(column.title), data_type="number" if column.numeric
                           else "text", title="click to sort") for column in _COLUMNS)
    rows = []
    previous = -1
    for record in records:
        if hidden_hint is not None and record.index != previous + 1:
            rows.append(_gap_row(record.index - previous - 1, hidden_hint))
        rows.append(_record_row(record, report, row_id=f"{row_prefix}{record.index}"))
        previous = record.index
    if hidden_hint is not None and last_index is not None and previous < last_index:
        rows.append(_gap_row(last_index - previous, hidden_hint))
    widths = "".join(element("col", "", style=f"width: {column.width}" if column.width
                             else None) for column in _COLUMNS)
    table = element("table", element("colgroup", widths) + element("thead", element("tr", head))
                    + element("tbody", "".join(rows)), id=table_id, class_="records sortable")
    return element("div", table, class_="scroll")


def _gap_row(count: int, hint: str) -> str:
    """A row standing for ``count`` hidden rows."""
    return element("tr", element("td", escaped(f"… {count} rows hidden; {hint}"),
                                 colspan=len(_COLUMNS)), class_="gap")


def _record_row(record: Record, report: Report, *, row_id: str) -> str:
    """One record's row."""
    cells = "".join(
        element("td", breakable(column.cell(record)) if column.name
                else escaped(column.cell(record)), data_sort=column.sort_key(record),
                class_=_cell_class(column, record))
        for column in _COLUMNS
    )
    first = record is report.first_divergence
    culprit = report.culprit is not None and record is report.culprit
    classes = (["fail" if record.failed else "pass"] + (["first-divergence"] if first else [])
               + (["culprit"] if culprit else []))
    title = " and ".join(["first divergence"] * first + ["culprit"] * culprit) or None
    return element("tr", cells, id=row_id, class_=" ".join(classes), title=title)


def _cell_class(column: _Column, record: Record) -> str:
    """A name cell wraps; the others never do; status cells are coloured."""
    if column.name:
        return "name"
    return "fig" + (f" status-{record.figures.status}" if column.status else "")


def comparisons_section(report: Report) -> str:
    """Every aligned comparison, sortable and filterable."""
    if not report.comparisons:
        content = element("p", "No intermediate value could be aligned.", class_="muted")
        return section("comparisons", content, id_="comparisons-section")
    table = records_table(report.comparisons, report, table_id="comparisons", row_prefix="row-")
    return section("comparisons (topological order)",
                   _filter_controls(len(report.comparisons)) + table, id_="comparisons-section")


def _filter_controls(count: int) -> str:
    """The filter box over the comparison table and its count of rows shown."""
    box = element("input", type="search", id="filter",
                  placeholder="filter rows: module, node, op, status…",
                  aria_label="filter the comparison rows")
    shown = element("span", escaped(f"{count} of {count} rows"), id="filter-count",
                    class_="muted")
    return element("div", box + shown, class_="controls")


def outputs_section(report: Report) -> str:
    """The final outputs, which decide the verdict."""
    table = records_table(report.final_outputs, report, table_id="outputs",
                          row_prefix="output-")
    return section("final outputs", table, id_="outputs-section")


def not_compared_section(report: Report) -> str:
    """Values of either side with no counterpart, grouped by reason."""
    groups = group_not_compared(report)
    if not groups:
        return ""
    content = element("ul", "".join(
        element("li", element("p", escaped(f"{why}:"))
                + element("p", ", ".join(element("code", escaped(name)) for name in names)))
        for why, names in groups
    ), class_="reasons")
    count = sum(len(names) for _, names in groups)
    what = "values" if report.coverage.granularity == "op" else "module outputs"
    return section(f"not compared ({count} {what})", content, id_="not-compared")
