"""The HTML report's record tables: comparisons, final outputs, and what was not compared.

The record tables sort by any column (the page's script reads each cell's ``data-sort``)
and the comparison table filters by text; the first divergence's row is highlighted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bisect_onnx.graph.provenance import short_op
from bisect_onnx.judge.records import Record, Report
from bisect_onnx.report.formatting import (
    format_module,
    format_number,
    format_record_shape,
    format_rounded_up,
)
from bisect_onnx.report.html_markup import element, escaped, section
from bisect_onnx.report.text import group_not_compared

__all__ = ["comparisons_section", "not_compared_section", "outputs_section"]


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
    _Column("torch module", format_module, format_module),
    _Column("ONNX node", lambda r: r.onnx_node or r.onnx_value,
            lambda r: r.onnx_node or r.onnx_value),
    _Column("op", lambda r: r.onnx_op or "", lambda r: r.onnx_op or ""),
    _Column("shape", format_record_shape, format_record_shape),
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
    head = "".join(element("th", escaped(column.title), data_type="number" if column.numeric
                           else "text", title="click to sort") for column in _COLUMNS)
    rows = "".join(_record_row(record, marked=record is first, row_id=f"{row_prefix}{record.index}")
                   for record in records)
    return element("table", element("thead", element("tr", head)) + element("tbody", rows),
                   id=table_id, class_="records sortable")


def _record_row(record: Record, *, marked: bool, row_id: str) -> str:
    """One record's row."""
    cells = "".join(
        element("td", escaped(column.cell(record)), data_sort=column.sort_key(record),
                class_=f"status-{record.status}" if column.status else None)
        for column in _COLUMNS
    )
    classes = ["fail" if record.failed else "pass"] + (["first-divergence"] if marked else [])
    return element("tr", cells, id=row_id, class_=" ".join(classes),
                   title="first divergence" if marked else None)


def comparisons_section(report: Report) -> str:
    """Every aligned comparison, sortable and filterable."""
    if not report.comparisons:
        content = element("p", "No intermediate value could be aligned.", class_="muted")
        return section("comparisons", content, id_="comparisons-section")
    table = _records_table(report.comparisons, report.first_divergence, table_id="comparisons",
                           row_prefix="row-")
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
    table = _records_table(report.final_outputs, report.first_divergence, table_id="outputs",
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
