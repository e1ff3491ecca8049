"""Reports made by hand for the formatting tests, through the one assembler.

A report is made only by :func:`bisect_onnx.judge.assembly.assemble`, from findings:
these helpers build the findings a run would have found for hand-made rows, so the
formatting tests see reports that hold the same invariants as real ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bisect_onnx.judge.assembly import amended, assemble
from bisect_onnx.judge.findings import (
    FINAL_OUTPUTS,
    KERNEL_VALUES,
    AttributionFindings,
    ComparisonFindings,
    Findings,
    LocalFigures,
    RowRef,
    RunDescription,
)
from bisect_onnx.judge.records import Coverage, Record, Report


def made_report(rows: list[Record], final_outputs: list[Record], *, verdict: str = "diverged",
                first_divergence: Record | None = None, culprit: Record | None = None,
                coverage: Coverage | None = None, note: str | None = None,
                attribution: dict[str, Any] | None = None, **description: Any) -> Report:
    """A report of ``rows``; a ``culprit`` gets the local figures a check would show."""
    in_outputs = first_divergence is not None and first_divergence not in rows
    comparison = ComparisonFindings(
        verdict=verdict, rtol=1e-3, atol=1e-5, final_outputs=tuple(final_outputs),
        comparisons=tuple(rows), coverage=coverage or _counted(rows),
        first_divergence=RowRef.of(first_divergence, FINAL_OUTPUTS if in_outputs
                                   else "comparisons"),
        note=note)
    checked = None
    if culprit is not None:
        figures = {culprit.onnx_value: LocalFigures(
            introduced_here=True,
            local_max_abs_error=culprit.local.max_abs_error or culprit.figures.max_abs_error,
            local_status="fail", local_exceeds=True, isolation="node",
            classification=culprit.local.classification)}
        if culprit in rows:
            checked = AttributionFindings(checked=figures, culprits=(RowRef(culprit.onnx_value),),
                                          evidence=attribution or {})
        else:  # a value inside a fused kernel: no row of the table
            checked = AttributionFindings(
                checked={}, kernel_checked=figures, kernel_values=(culprit,),
                culprits=(RowRef(culprit.onnx_value, KERNEL_VALUES),),
                evidence=attribution or {})
    return assemble(Findings(comparison, attribution=checked,
                             description=RunDescription(**description)))


def _counted(rows: list[Record]) -> Coverage:
    """The coverage the rows hold: every row a module call of its own name."""
    calls = len({row.torch_module for row in rows if row.torch_module is not None})
    return Coverage(len(rows), len(rows), calls, calls)


def with_rows(report: Report, rows: list[Record], **changes: Any) -> Report:
    """``report`` with other rows (the same values), warnings or culprit node."""
    findings = report.findings
    comparison = replace(findings.judged, comparisons=tuple(rows),
                         warnings=tuple(changes.pop("warnings", findings.judged.warnings)))
    description = replace(findings.description or RunDescription(), **changes)
    if findings.search is not None and findings.search.comparison is not None:
        return amended(report, search=replace(findings.search, comparison=comparison),
                       description=description)
    return amended(report, comparison=comparison, description=description)
