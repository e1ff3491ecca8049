"""The one place a :class:`~bisect_onnx.judge.records.Report` is made: findings in.

:func:`assemble` lays a sample's report out of the :class:`~bisect_onnx.judge.reading.Reading`
of its :class:`~bisect_onnx.judge.findings.Findings` (whose claims are checked there), once,
after its last stage; :func:`amended` makes it again where a finding is added after the
run (a repro written, a fix written out, the samples' note).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from bisect_onnx.judge.findings import COMPARISONS, FINAL_OUTPUTS, KERNEL_VALUES, Findings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Report
from bisect_onnx.judge.report_parts import (
    CaptureDescription,
    CulpritSegment,
    Environment,
    ReproFolder,
)

__all__ = ["assemble", "amended"]


def assemble(findings: Findings) -> Report:
    """The report of one sample, laid out of what its stages found, once.

    The claims are checked as :class:`Reading` checks them; the report holds its
    rows, the run's description, warnings, fixes and repro.
    """
    reading = Reading(findings)
    claims = reading.claims
    comparison = findings.judged
    description = findings.description
    note = comparison.note
    if findings.samples_note:
        note = f"{note} {findings.samples_note}" if note else findings.samples_note
    if findings.sweep is not None:
        said = findings.sweep.verdict_note()
        note = f"{note}; {said}" if note else said
    attribution = claims.attribution
    return Report(
        verdict=comparison.verdict,
        rtol=comparison.rtol,
        atol=comparison.atol,
        environment=cast(Environment, dict(description.environment) if description else {}),
        reference=dict(description.reference) if description else {},
        candidate=dict(description.candidate) if description else {},
        final_outputs=claims.tables[FINAL_OUTPUTS],
        comparisons=claims.tables[COMPARISONS],
        coverage=claims.coverage,
        unaligned=list(comparison.unaligned),
        onnx_unaligned=list(comparison.onnx_unaligned),
        op_comparisons=list(comparison.op_comparisons),
        warnings=[*comparison.warnings, *findings.warnings,
                  *(description.warnings if description else ()), *claims.said,
                  *findings.repro_warnings],
        note=note,
        repro=ReproFolder.from_dict(findings.repro) if findings.repro is not None else None,
        attribution=reading.attribution,
        capture=cast(CaptureDescription, dict(description.capture) if description else {}),
        inside_op=reading.inside_op,
        culprit_node=reading.culprit_node,
        tolerance_basis=comparison.tolerance_basis,
        search=reading.search,
        kernel_values=claims.tables[KERNEL_VALUES],
        culprit_segment=(CulpritSegment.from_dict(attribution.segment) if attribution is not None
                         and attribution.segment is not None else None),
        first_divergence_ref=reading.first_divergence_ref,
        # A segment named first: later culprits are listed, none is *the* culprit.
        culprit_ref=reading.culprit_ref,
        culprit_refs=reading.culprit_refs,
        nan_origin_ref=reading.nan_origin_ref,
        fixes=tuple(findings.fixes),
        fix_notes=tuple(findings.fix_notes),
        sweep=findings.sweep,
        findings=findings,
    )


def amended(report: Report, **changes: Any) -> Report:
    """``report`` assembled again with some of its findings changed (``repro=...``).

    Raises:
        ValueError: ``report`` was read back by ``Report.load`` (or ``from_dict``): the
            JSON holds what was found, not the findings it was assembled from.
    """
    if report.findings is None:
        raise ValueError("a report read back from JSON cannot be assembled again: it holds "
                         "no findings; amend the report the run returned")
    return assemble(replace(report.findings, **changes))


