"""A check's rows shown as the recording showed them: torch op, module, source line.

The check compares ONNX values; the recording knew, for each, the torch op, the module
call and the source line it stands for (:class:`~bisect_onnx.reference.manifest.RowProvenance`).
This stage lays the check's figures out on the recorded rows (several module calls may
show one value, as they did), with the recording's granularity and coverage, and says
what needs PyTorch and so was not done here, with the command that does it where
PyTorch runs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.judge.vocabulary import Granularity, ReportWarning
from bisect_onnx.pytorch.calls import input_of
from bisect_onnx.reference.manifest import PYTORCH
from bisect_onnx.search.classify import Kind

if TYPE_CHECKING:
    from bisect_onnx.judge.findings import ComparisonFindings, Findings
    from bisect_onnx.pipeline.check_stages import CheckModels
    from bisect_onnx.pipeline.onnx_sample import OnnxSample
    from bisect_onnx.reference.manifest import Manifest, RowProvenance

__all__ = ["show_recorded_rows", "NEEDS_PYTORCH", "RERUN_WITH_PYTORCH", "WIDER_THAN_RECORDED"]

NEEDS_PYTORCH = ReportWarning(
    "needs-pytorch",
    "checked against a recorded reference, without PyTorch: the culprit's float64 "
    "classification (graph semantics, runtime kernel or float precision) and the look "
    "inside its torch op need PyTorch; where it runs: {command}")
WIDER_THAN_RECORDED = ReportWarning(
    "wider-than-recorded",
    "the recording diverged at its tolerance (rtol={rtol:g}, atol={atol:g}); this check "
    "passes at a wider one (rtol={here_rtol:g}, atol={here_atol:g}: {why}): check with "
    "--rtol {rtol:g} --atol {atol:g} to hold this runtime to the recorded tolerance")
NO_TORCH_FIXES = ("the exporter and eval-mode fix searches need PyTorch; where it runs: "
                  "{command} --suggest-fix")
#: A row of one output of a module call that returns several (``block[1]``).
_OUTPUT_INDEX = re.compile(r"(\[[^\]]*\])+$")
#: How to run the comparison where PyTorch runs, where the recording did not say.
RERUN_WITH_PYTORCH = "bisect-onnx MODEL --onnx FILE --input INPUTS (as recorded)"


def show_recorded_rows(sample: OnnxSample) -> OnnxSample:
    """The sample's findings with the recorded rows, granularity, coverage and notes."""
    models: CheckModels = sample.models  # type: ignore[assignment] (a check's models)
    manifest, findings = models.manifest, sample.findings
    search = findings.search
    if search is not None and search.comparison is not None:
        search = replace(search, comparison=_as_recorded(search.comparison, manifest))
    command = manifest.command or RERUN_WITH_PYTORCH
    # A reference ONNX file's values: the in-process run needs no PyTorch either.
    of_pytorch = manifest.reference_kind == PYTORCH
    attribution = findings.attribution
    if attribution is not None:
        attribution = replace(attribution, evidence=_unclassified_here(
            attribution.evidence, command) if of_pytorch else attribution.evidence,
            kernel_values=tuple(
            _kernel_row(record, manifest) for record in attribution.kernel_values))
    comparison = _as_recorded(findings.comparison, manifest)
    if models.tolerance_basis is not None:
        comparison = replace(comparison, tolerance_basis=models.tolerance_basis)
    shown = replace(findings, comparison=comparison,
                    search=search, attribution=attribution,
                    description=_described(findings, manifest))
    reading = Reading(shown)
    notes = [models.other_file] if models.other_file else []
    if of_pytorch and (reading.diverged or reading.hidden_divergences):
        notes.append(NEEDS_PYTORCH.format(command=command))
    wider = _wider_than_recorded(models, diverged=reading.diverged)
    if wider is not None:
        notes.append(wider)
    fix_notes = shown.fix_notes
    if of_pytorch and models.fixes.suggest:
        fix_notes = (*fix_notes, NO_TORCH_FIXES.format(command=command))
    return replace(sample, findings=replace(shown, warnings=(*shown.warnings, *notes),
                                            fix_notes=fix_notes))


def _wider_than_recorded(models: CheckModels, *, diverged: bool) -> ReportWarning | None:
    """Where a check passes only at a wider tolerance than the recording diverged at.

    A check in OpenVINO's bf16 is judged at bfloat16's tolerance; the recording's own
    runtime may have diverged from PyTorch at float32's, which the verdict alone hides.
    """
    manifest = models.manifest
    if diverged or manifest.recorded.get("verdict") != "diverged":
        return None
    here, recorded = (models.rtol, models.atol), (manifest.rtol, manifest.atol)
    if None in (*here, *recorded):  # a reference ONNX file's: its file's precision rules
        return None
    if here == recorded or here[0] < recorded[0] or here[1] < recorded[1]:
        return None
    return WIDER_THAN_RECORDED.format(rtol=recorded[0], atol=recorded[1], here_rtol=here[0],
                                      here_atol=here[1],
                                      why=models.tolerance_basis or "given here")


def _as_recorded(comparison: ComparisonFindings, manifest: Manifest) -> ComparisonFindings:
    """The comparison's rows as the recording showed them, in its granularity.

    A value with no recorded row is shown too: one inside a kernel the recording's
    runtime fused (as PyTorch named it), or one the recording compared as a final
    output only (no module call: it counts in no coverage figure).
    """
    rows_of: dict[str, list[RowProvenance]] = defaultdict(list)
    for row in manifest.rows:
        rows_of[row.onnx_value].append(row)
    rows: list[Record] = []
    for record in comparison.comparisons:
        for provenance in rows_of.get(record.onnx_value) or [
                manifest.provenance.get(record.onnx_value)]:
            rows.append(provenance.shown_on(record, len(rows)) if provenance is not None
                        else replace(record, index=len(rows), torch_module=None,
                                     match=replace(record.match, reference_value=None,
                                                   reference_node=None)))
    finals = [manifest.final_outputs[index].shown_on(record, index)
              if index < len(manifest.final_outputs) else record
              for index, record in enumerate(comparison.final_outputs)]
    return replace(comparison, comparisons=tuple(rows), final_outputs=tuple(finals),
                   coverage=_coverage(manifest, rows, len(comparison.comparisons)))


def _coverage(manifest: Manifest, rows: list[Record], compared: int) -> Coverage:
    """The recording's coverage, with what the check's rows compared."""
    coverage = replace(Coverage.from_dict(manifest.coverage), aligned_values=compared)
    if coverage.granularity == Granularity.OP:
        return replace(coverage, compared_ops=len({row.fx_node for row in rows
                                                   if row.fx_node}))
    # The module calls the rows compare (those inside kernels the recording's runtime
    # fused that this one captured too; not those it fused), each once.
    return replace(coverage, aligned_modules=len({_call_of(row.torch_module) for row in rows
                                                  if row.torch_module is not None}))


def _call_of(name: str) -> str:
    """The module call a module row's value belongs to: ``fc`` for ``fc (input)``."""
    entering = input_of(name)
    return entering[0] if entering else _OUTPUT_INDEX.sub("", name)


def _unclassified_here(evidence: Mapping[str, Any], command: str) -> Mapping[str, Any]:
    """An unclassified culprit's reason: its float64 rerun needs PyTorch, not here."""
    kind = evidence.get("classification")
    if not isinstance(kind, Mapping) or kind.get("kind") != Kind.UNCLASSIFIED:
        return evidence
    return {**evidence, "classification": {
        **kind, "detail": "checked without PyTorch, whose float64 rerun of the torch op "
                          "tells the exporter from the runtime",
        "file_with": f"unknown here: run {command} where PyTorch runs"}}


def _kernel_row(record: Record, manifest: Manifest) -> Record:
    """A value inside a fused kernel, as PyTorch's side named it at the recording."""
    provenance = manifest.provenance.get(record.onnx_value) or next(
        (row for row in manifest.rows if row.onnx_value == record.onnx_value), None)
    if provenance is None:
        return replace(record, match=replace(record.match, reference_value=None,
                                             reference_node=None))
    return provenance.shown_on(record, record.index)


def _described(findings: Findings, manifest: Manifest):
    """The run's description: the check's runtime, the recording's PyTorch and exporter."""
    description = findings.description
    if description is None:
        return None
    recorded = manifest.environment
    environment = {**description.environment,
                   **{key: recorded.get(key) for key in ("torch", "exporter", "opset", "cpu")
                      if key in recorded},
                   "recorded_on": {key: recorded.get(key) for key in (
                       "runtime", "provider", "opt_level", "platform", "onnxruntime")}}
    return replace(description, environment=environment)
