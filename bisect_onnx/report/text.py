"""The terminal table and the one-line verdict."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from bisect_onnx.provenance import SourceLocation
from bisect_onnx.records import Record, Report

__all__ = ["format_table", "verdict_line", "SHOW_CHOICES", "format_number", "format_shape",
           "format_source", "format_rounded_up"]

SHOW_CHOICES = ("window", "all")
# Tables longer than this are cut to a window around the first divergence: a
# 300-row ResNet table would push the verdict off the screen.
_WINDOW_THRESHOLD = 40
_WINDOW_RADIUS = 8
_MARK = ">>"
_NAMES_PER_REASON = 6
_HEADERS = ["", "#", "torch module", "ONNX node", "op", "shape", "max abs", "max rel", "status"]


def format_table(report: Report, *, show: str = "window") -> str:
    """The comparisons in topological order, then the final outputs."""
    rows = report.comparisons
    keep = _rows_to_show(report, show)
    first = report.first_divergence
    body: list[list[str]] = []
    previous = -1
    for record in rows:
        if record.index not in keep:
            continue
        if record.index != previous + 1:
            body.append(["", "…", f"({record.index - previous - 1} rows hidden; --show all)"]
                        + [""] * 6)
        body.append(_row(record, marked=record is first))
        previous = record.index
    if rows and previous != rows[-1].index:
        body.append(["", "…", f"({rows[-1].index - previous} rows hidden; --show all)"]
                    + [""] * 6)
    parts = []
    if body:
        parts.append(tabulate(body, headers=_HEADERS, tablefmt="simple", disable_numparse=True))
    else:
        parts.append("(no intermediate value could be aligned)")
    outputs = [_row(record, marked=record is first) for record in report.final_outputs]
    parts.append("final outputs:\n" + tabulate(
        outputs, headers=_HEADERS, tablefmt="simple", disable_numparse=True
    ))
    if report.unaligned:
        parts.append(_not_compared(report))
    return "\n\n".join(parts)


def _not_compared(report: Report) -> str:
    """The module calls with no ONNX counterpart, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for item in report.unaligned:
        by_reason.setdefault(item.reason, []).append(item.name)
    lines = [f"not compared ({len(report.unaligned)} module outputs):"]
    for reason, names in by_reason.items():
        shown = ", ".join(names[:_NAMES_PER_REASON])
        if len(names) > _NAMES_PER_REASON:
            shown += f" and {len(names) - _NAMES_PER_REASON} more"
        lines.append(f"  {shown}: {reason}")
    return "\n".join(lines)


def verdict_line(report: Report) -> str:
    """``PARITY: ...`` or ``DIVERGED: first divergence at ...`` in one line."""
    coverage = report.coverage
    compared = f"{coverage.aligned_modules} of {coverage.torch_modules} module calls compared"
    tolerance = f"rtol={report.rtol:g}, atol={report.atol:g}"
    if not report.diverged:
        if coverage.aligned_modules == 0:
            return (
                f"PARITY OF FINAL OUTPUTS ONLY ({tolerance}): no intermediate value could be "
                f"aligned (0 of {coverage.torch_modules} module calls), so nothing inside the "
                "model was checked"
            )
        hidden = len(report.hidden_divergences)
        extra = f"; {hidden} hidden intermediate divergence(s)" if hidden else ""
        return (
            f"PARITY: {len(report.final_outputs)} final output(s) within {tolerance} "
            f"({compared}{extra})"
        )
    record = report.first_divergence
    assert record is not None
    where = f"ONNX node {record.onnx_node!r} ({record.onnx_op}), value {record.onnx_value!r}"
    module = (
        f"torch module {record.torch_module}" if record.torch_module
        else "a final output"
    )
    op = f" [{record.torch_op}]" if record.torch_op else ""
    source = f" at {format_source(record.source)}" if record.source else ""
    line = (
        f"DIVERGED: first divergence at {where} <- {module}{op}{source}: "
        f"{_describe_error(record)} ({tolerance}; {compared})"
    )
    if report.note:
        line += f". {report.note}"
    return line


def _rows_to_show(report: Report, show: str) -> set[int]:
    rows = report.comparisons
    if show == "all" or len(rows) <= _WINDOW_THRESHOLD:
        return {record.index for record in rows}
    first = report.first_divergence
    in_table = first is not None and any(record is first for record in rows)
    focus = first.index if in_table and first is not None else rows[-1].index
    keep = set(range(focus - _WINDOW_RADIUS, focus + _WINDOW_RADIUS + 1))
    keep.update(record.index for record in report.hidden_divergences[:_WINDOW_RADIUS])
    return keep


def _row(record: Record, *, marked: bool) -> list[str]:
    shape = format_shape(record.shape)
    if record.candidate_shape != record.shape:
        shape += f" vs {format_shape(record.candidate_shape)}"
    return [
        _MARK if marked else "",
        str(record.index),
        record.torch_module if record.torch_module is not None else f"(output {record.index})",
        record.onnx_node or record.onnx_value,
        record.onnx_op or "",
        shape,
        format_number(record.max_abs_error),
        format_number(record.max_rel_error),
        record.status,
    ]


def _describe_error(record: Record) -> str:
    if record.status == "shape_mismatch":
        return (f"shape {format_shape(record.shape)} in torch, "
                f"{format_shape(record.candidate_shape)} in ONNX")
    if record.status == "dtype_mismatch":
        return f"dtype {record.dtype} in torch, {record.candidate_dtype} in ONNX"
    parts = [f"max abs {format_number(record.max_abs_error)}",
             f"max rel {format_number(record.max_rel_error)}"]
    if record.mismatch_fraction is not None:
        parts.append(f"{record.mismatch_fraction:.1%} of elements out of tolerance")
    if record.nan_mismatch:
        parts.append(f"{record.nan_mismatch} NaN/Inf in different places")
    elif record.min_passing_atol is not None:
        parts.append(f"atol >= {format_rounded_up(record.min_passing_atol)} would pass")
    return ", ".join(parts)


def format_source(location: SourceLocation) -> str:
    """``file:line``, the file relative to the current folder when it lies inside it."""
    path = Path(location.file)
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return f"{path}:{location.line}"


def format_shape(shape: Sequence[int]) -> str:
    """``[1,3,32,32]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def format_rounded_up(value: float) -> str:
    """Three significant digits, rounded up: a printed atol that is advised must pass."""
    text = f"{value:.2e}"
    if float(text) < value:
        step = 10.0 ** (int(text.split("e")[1]) - 2)
        text = f"{(math.floor(value / step) + 1) * step:.2e}"
    return text


def format_number(value: float | None) -> str:
    """An error figure in three significant digits (``-`` where it does not apply)."""
    return "-" if value is None else f"{value:.2e}"
