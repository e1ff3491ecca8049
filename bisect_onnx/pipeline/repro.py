"""The repro of one sample's culprit, written the same way for both comparison modes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.judge.records import Report
from bisect_onnx.report.repro import write_repro
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture, SampleArrays

if TYPE_CHECKING:
    from bisect_onnx.judge.tolerances import Tolerance
    from bisect_onnx.pipeline.torch_sample import TorchSample

__all__ = ["write_sample_repro", "write_torch_repro"]


def write_sample_repro(folder: Path, *, report: Report, candidate: Runner,
                       failing_value: str, values: SampleArrays, tolerance: Tolerance,
                       reference_label: str) -> dict[str, Any]:
    """Write the minimal repro of ``failing_value``; describe it for the report."""
    repro = write_repro(folder, model=candidate.model,
                        model_dir=candidate.path.resolve().parent,
                        failing_value=failing_value, values=values, tolerance=tolerance,
                        environment=report.environment, reference_label=reference_label)
    return {"folder": str(repro.folder), "nodes": repro.nodes, "inputs": repro.inputs,
            "reproduces": repro.reproduces}


def write_torch_repro(folder: Path, *, sample: TorchSample) -> dict[str, Any]:
    """The PyTorch form's repro: PyTorch's values as the expected, outputs included.

    Judged at the tolerance of the culprit's row (the run's judge).
    """
    report, candidate = sample.report, sample.candidate
    torch_capture, onnx_capture = sample.torch_capture, sample.onnx_capture
    expected = dict(sample.values.reference)
    expected.update({cand.name: ref.array for ref, cand in
                     zip(torch_capture.outputs, onnx_capture.outputs, strict=False)})
    graph_inputs = {spec.name: array for spec, array in zip(candidate.inputs, sample.arrays,
                                                            strict=True)}
    return write_sample_repro(
        folder, report=report, candidate=candidate,
        failing_value=_repro_value(report, onnx_capture),
        values=SampleArrays(expected, sample.values.candidate, graph_inputs),
        tolerance=sample.settings.judge.of(report.culprit or report.first_divergence),
        reference_label="PyTorch")


def _repro_value(report: Report, onnx_capture: Capture) -> str:
    """The value the repro recomputes: the culprit's, or its fused kernel's output.

    A repro must show what the production session computes, and a value ONNX Runtime
    fused away is not computed there.
    """
    culprit = report.culprit or report.first_divergence
    if culprit.onnx_value in onnx_capture.values:
        return culprit.onnx_value
    kernel = (report.attribution.inside_kernel if report.attribution else None) or {}
    return kernel.get("kernel_output") or report.first_divergence.onnx_value
