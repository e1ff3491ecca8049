"""The report's descriptive fields for a PyTorch-form run: what was compared, how, where."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.judge.findings import RunDescription
from bisect_onnx.pipeline.environment import environment
from bisect_onnx.pipeline.production import capture_warning
from bisect_onnx.report.context import culprit_context

if TYPE_CHECKING:
    from bisect_onnx.judge.reading import Reading
    from bisect_onnx.pipeline.torch_sample import TorchSample

__all__ = ["describe_run"]


def describe_run(sample: TorchSample, report: Reading) -> RunDescription:
    """What was compared, how, and where, for ``report`` (its culprit's node in its graph)."""
    settings, run = sample.settings, sample.run
    prepared, export, tolerance = settings.prepared, settings.export, settings.judge.base
    candidate = prepared.candidate
    capture = candidate.describe_capture(run.production_check)
    warnings = []
    warning = capture_warning(run.production_check, capture,
                              share=run.tolerance_used(tolerance.rtol, tolerance.atol))
    if warning:
        warnings.append(warning)
    if export.opset is not None and candidate.opset != export.opset:
        warnings.append(f"asked for opset {export.opset}, but the {export.exporter} "
                        f"exporter produced opset {candidate.opset}")
    shown = report.culprit or report.first_divergence
    return RunDescription(
        environment=environment(candidate, exporter=prepared.exporter),
        reference={**settings.reference.side.describe(), "inputs": sample.description},
        candidate={**candidate.describe(), "model": prepared.source},
        capture=capture,
        culprit_node=culprit_context(shown, candidate, sample.torch_capture,
                                     sample.onnx_capture, report.comparisons),
        warnings=tuple(warnings))
