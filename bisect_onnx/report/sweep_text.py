"""The sweep's table in the text report: each combination tried, its worst error, its verdict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bisect_onnx.judge.sweep_table import shapes_text
from bisect_onnx.report.html_markup import element, escaped, table

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report
    from bisect_onnx.judge.sweep_table import SweepRow, SweepTable

__all__ = ["sweep_section", "sweep_text", "sweep_html", "sweep_cells", "SWEEP_HEADINGS"]

SWEEP_HEADINGS = ("shapes", "inputs", "worst error", "verdict")
_REASON_SHOWN = 100


def sweep_section(report: Report) -> str:
    """The sweep's table, the bisected combination marked; empty without a sweep."""
    return sweep_text(report.sweep) if report.sweep is not None else ""


def sweep_text(sweep: SweepTable) -> str:
    """The sweep's table, the bisected (or refused) combination marked ``>>``."""
    dims = ", ".join(sweep.free_dims) or "none"
    lines = [f"sweep (final outputs only, until one fails; free dimensions: {dims}):"]
    cells = [SWEEP_HEADINGS, *(sweep_cells(sweep, row) for row in sweep.rows)]
    widths = [max(len(line[column]) for line in cells) for column in range(3)]
    for index, line in enumerate(cells):
        marker = ">>" if index - 1 == sweep.bisected and index else "  "
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        lines.append(f"{marker} {text}  {line[3]}".rstrip())
    if sweep.note:
        lines.append(f"   {sweep.note}")
    return "\n".join(lines)


def sweep_cells(sweep: SweepTable, row: SweepRow) -> tuple[str, str, str, str]:
    """One row's cells: shapes, how the inputs were drawn, worst error, verdict (and why)."""
    error = row.max_abs_error
    figure = "-" if error is None else ("inf" if math.isinf(error) else f"{error:.2e}")
    reason = row.reason or ""
    if len(reason) > _REASON_SHOWN:  # the runtime's whole message is in the JSON report
        reason = reason[:_REASON_SHOWN - 3] + "..."
    verdict = row.verdict + (f" ({reason})" if reason else "")
    return shapes_text(sweep.input_names, row.shapes), row.scale, figure, verdict


def sweep_html(sweep: SweepTable) -> str:
    """The sweep's table in HTML (the HTML report's section, a notebook's block)."""
    rows = [[escaped(cell) if index or number != sweep.bisected
             else element("strong", escaped(cell))
             for index, cell in enumerate(sweep_cells(sweep, row))]
            for number, row in enumerate(sweep.rows)]
    note = element("p", escaped(sweep.note), class_="note") if sweep.note else ""
    return table(SWEEP_HEADINGS, rows) + note

