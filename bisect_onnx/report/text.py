"""The terminal table: aligned rows around the first divergence, what was not compared."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from bisect_onnx.graph.provenance import short_op
from bisect_onnx.report.formatting import (
    format_module,
    format_number,
    format_record_shape,
)
from bisect_onnx.report.verdict import describe_origin, fed_description, ops_scope
from bisect_onnx.runtime.registry import display_name

if TYPE_CHECKING:  # types only: records import this module to format themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["format_table", "SHOW_CHOICES", "coverage_line", "group_not_compared",
           "rows_to_show"]

SHOW_CHOICES = ("window", "all")
# Tables longer than this are cut to a window around the first divergence: a
# 300-row ResNet table would push the verdict off the screen.
_WINDOW_THRESHOLD = 40
_WINDOW_RADIUS = 8
_MARK = ">>"
_NAMES_PER_REASON = 6
_HEADERS = ["", "#", "torch module", "ONNX node", "op", "shape", "max abs", "max rel", "status"]
_OP_HEADERS = ["", "#", "torch op", "torch module", "ONNX node", "op", "shape", "max abs",
               "max rel", "status"]
_AGGREGATE_HEADER = "ops failed"
_MATCH_HEADER = "match"
# ONNX against ONNX: a row per reference value; SQNR for converted (float16, QDQ) values.
_VALUE_HEADERS = ["", "#", "value", "torch module", "ONNX node", "op", "shape", "max abs",
                  "max rel", "status"]
_SQNR_HEADER = "SQNR dB"
_KIND_TITLES = {
    "module": "module outputs",
    "fused": "ops fused into another op's ONNX node by the exporter's optimizer",
    "runtime-fused": "ops inside a kernel {runtime} fused (no value in production)",
    "not-probed": "ops not probed (over the memory budget, values are fetched only to "
                  "locate the divergence)",
    "removed": "ops that returned their input unchanged (removed; compared at the input)",
    "folded": "ops with no ONNX node (folded into constants or removed)",
    "sizes": "ops made from sizes alone or read only for their size (the same whatever "
             "the input; not compared)",
    "layout": "ops whose ONNX values changed layout or type",
    "intermediate": "ONNX values inside multi-node ops (no torch value; compared at the "
                    "op's output)",
    "foreign": "ONNX values with no torch metadata",
    "unmatched": "ops no value of the given file matches by structure",
    "ambiguous": "ONNX values that fit several ops equally (ambiguous, not compared)",
}


def format_table(report: Report, *, show: str = "window") -> str:
    """The comparisons in topological order, then the final outputs."""
    rows = report.comparisons
    keep = rows_to_show(report, show)
    first = report.first_divergence
    headers = _headers(report)
    body: list[list[str]] = []
    previous = -1
    for record in rows:
        if record.index not in keep:
            continue
        if record.index != previous + 1:
            body.append(["", "…", f"({record.index - previous - 1} rows hidden; --show all)"]
                        + [""] * (len(headers) - 3))
        body.append(_row(record, marked=record is first, headers=headers))
        previous = record.index
    if rows and previous != rows[-1].index:
        body.append(["", "…", f"({rows[-1].index - previous} rows hidden; --show all)"]
                    + [""] * (len(headers) - 3))
    parts = []
    if body:
        parts.append(tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True))
    else:
        parts.append("(no intermediate value could be aligned)")
    outputs = [_row(record, marked=record is first, headers=headers)
               for record in report.final_outputs]
    parts.append("final outputs:\n" + tabulate(
        outputs, headers=headers, tablefmt="simple", disable_numparse=True
    ))
    if report.culprits is not None:
        parts.append(_culprit_list(report))
    if group_not_compared(report):
        parts.append(_not_compared(report))
    parts.append(coverage_line(report))
    return "\n\n".join(parts)


def _headers(report: Report) -> list[str]:
    if report.coverage.granularity == "value":
        extra = [_SQNR_HEADER] * any(record.figures.sqnr_db is not None for record in
                                     [*report.comparisons, *report.final_outputs])
        extra += [_MATCH_HEADER] * any(record.match.matched_by for record in report.comparisons)
        return [*_VALUE_HEADERS[:-1], *extra, _VALUE_HEADERS[-1]]
    if report.coverage.granularity == "op":
        if any(record.match.matched_by for record in report.comparisons):
            return [*_OP_HEADERS[:-1], _MATCH_HEADER, _OP_HEADERS[-1]]
        return _OP_HEADERS
    if any(record.match.ops_compared is not None for record in report.comparisons):
        return [*_HEADERS[:-1], _AGGREGATE_HEADER, _HEADERS[-1]]
    return _HEADERS


def _culprit_list(report: Report) -> str:
    """Every value that introduces error on its own (``--all-culprits``)."""
    culprits = report.culprits or []
    lines = [f"culprits ({len(culprits)}; values whose own node, fed "
             f"{fed_description(report)}, is "
             "out of tolerance beyond float rounding):"]
    for record in culprits:
        lines.append(f"  {record.onnx_value} ({record.onnx_node}, {record.onnx_op}) <- "
                     f"{describe_origin(record)}: off by "
                     f"{format_number(record.local.max_abs_error)} on its own, "
                     f"{record.local.classification or 'not classified'}")
    return "\n".join(lines)


def group_not_compared(report: Report) -> list[tuple[str, list[str]]]:
    """Values of either side with no counterpart, as (why, names) groups.

    Module outputs by reason; op-level values by kind, since their reasons name each
    op (every reason is in the JSON report).
    """
    groups: dict[str, list[str]] = {}
    if report.coverage.granularity != "op":
        for item in report.unaligned:
            groups.setdefault(item.reason, []).append(item.name)
        return list(groups.items())
    for item in [*report.unaligned, *report.onnx_unaligned]:
        groups.setdefault(item.kind, []).append(item.name)
    runtime = display_name((report.environment or {}).get("runtime"))
    return [(f"{_KIND_TITLES.get(kind, kind).format(runtime=runtime)} ({len(names)})", names)
            for kind, names in groups.items()]


def _not_compared(report: Report) -> str:
    if report.coverage.granularity != "op":
        what = "reference values" if report.coverage.granularity == "value" else "module outputs"
        lines = [f"not compared ({len(report.unaligned)} {what}):"]
    else:
        lines = ["not compared (every reason in the JSON report):"]
    lines.extend(_listing(names, why) for why, names in group_not_compared(report))
    return "\n".join(lines)


def _listing(names: Sequence[str], why: str) -> str:
    shown = ", ".join(names[:_NAMES_PER_REASON])
    if len(names) > _NAMES_PER_REASON:
        shown += f" and {len(names) - _NAMES_PER_REASON} more"
    return f"  {why}: {shown}"


def coverage_line(report: Report) -> str:
    """Attributed and compared coverage in one line."""
    coverage = report.coverage
    parts = [f"coverage: {_percent(coverage.attributed_nodes, coverage.onnx_nodes)} of "
             f"{coverage.onnx_nodes} ONNX nodes attributed to a torch op or module"]
    if coverage.inferred_nodes:
        parts[0] += f" ({coverage.inferred_nodes} without metadata, by their values' names or "
        parts[0] += "by structure)"
    if coverage.granularity == "value":
        return (f"coverage: {coverage.aligned_values} of {coverage.onnx_values} reference values "
                f"compared; {_percent(coverage.attributed_nodes, coverage.onnx_nodes)} of "
                f"{coverage.onnx_nodes} candidate nodes compared at an output")
    if coverage.granularity == "op" or coverage.torch_ops:
        in_kernels = sum(item.kind == "runtime-fused" for item in report.unaligned)
        parts.append(f"{coverage.compared_ops} of {coverage.torch_ops} torch ops"
                     f"{ops_scope(coverage)} compared ({coverage.fused_ops} fused by the "
                     f"exporter, {in_kernels} inside "
                     f"{display_name((report.environment or {}).get('runtime'))}'s kernels)")
        parts.append(f"{_percent(coverage.fx_named_compared, coverage.fx_named_values)} of "
                     f"{coverage.fx_named_values} floating-point ONNX values named after an "
                     "op compared")
    parts.append(f"{coverage.aligned_modules} of {coverage.torch_modules} module calls compared")
    return "; ".join(parts)


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def rows_to_show(report: Report, show: str) -> set[int]:
    """The indices of the rows a table shows: all, or a window around the divergence."""
    rows = report.comparisons
    if show == "all" or len(rows) <= _WINDOW_THRESHOLD:
        return {record.index for record in rows}
    first = report.first_divergence
    in_table = first is not None and any(record is first for record in rows)
    focus = first.index if in_table and first is not None else rows[-1].index
    keep = set(range(focus - _WINDOW_RADIUS, focus + _WINDOW_RADIUS + 1))
    keep.update(record.index for record in report.hidden_divergences[:_WINDOW_RADIUS])
    return keep


def _row(record: Record, *, marked: bool, headers: Sequence[str] = _HEADERS) -> list[str]:
    shape = format_record_shape(record)
    module = format_module(record)
    row = [_MARK if marked else "", str(record.index)]
    if headers[2] == _VALUE_HEADERS[2]:
        row += [record.match.reference_value or record.onnx_value, "" if record.torch_module is None
                else record.torch_module]
    elif headers[2] == _OP_HEADERS[2]:
        op = (f"{short_op(record.torch_op) if record.torch_op else 'an op'} ({record.fx_node})"
              if record.fx_node else "")
        row += [op, module or "(model)"]
    else:
        row.append(module or "(model)")  # the model's own forward, as op rows say it
    row += [record.onnx_node or record.onnx_value, record.onnx_op or "", shape,
            format_number(record.figures.max_abs_error),
            format_number(record.figures.max_rel_error)]
    if _AGGREGATE_HEADER in headers:
        row.append(f"{record.match.ops_failed}/{record.match.ops_compared}"
                   if record.match.ops_compared is not None else "")
    if _SQNR_HEADER in headers:
        row.append("-" if record.figures.sqnr_db is None else f"{record.figures.sqnr_db:.1f}")
    if _MATCH_HEADER in headers:
        row.append(f"{record.match.matched_by} {record.match.match_confidence:.2f}"
                   if record.match.matched_by and record.match.match_confidence is not None else "")
    return [*row, record.figures.status]
