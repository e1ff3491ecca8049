"""Which node introduced a PyTorch-form sample's divergence: attribution, then inside its op.

The culprit search (:mod:`bisect_onnx.search.blame`) runs on PyTorch's values, then the
node inside the culprit's op is looked for: by exporting the op alone (op level), or by
evaluating the exporter's translation of it (module level). Both return findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.op_level import look_inside_first_divergence
from bisect_onnx.align.script_inside import references_by_onnx_value
from bisect_onnx.judge.findings import Findings, Refinement
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.vocabulary import Granularity
from bisect_onnx.pipeline.inside_op import look_inside_module_culprit, name_the_ops
from bisect_onnx.pytorch.module_side import in_training_mode
from bisect_onnx.pytorch.script_ops import ScriptOpCapture
from bisect_onnx.runtime.sides import SampleArrays
from bisect_onnx.search.blame import Evidence, attribute_divergence

if TYPE_CHECKING:
    from bisect_onnx.pipeline.torch_sample import TorchSample
    from bisect_onnx.runtime.runner import Runner

__all__ = ["SampleValues", "attribute_sample", "graph_inputs"]


@dataclass
class SampleValues:
    """One sample's arrays by ONNX value name, for attribution and the repro."""

    reference: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]


def attribute_sample(sample: TorchSample, findings: Findings) -> tuple[Findings, SampleValues]:
    """Check failing values on PyTorch's inputs: which node introduced the error.

    The sample's ``float64`` reruns a module-level culprit's segment in PyTorch, where
    no program gives its float64 value. Returns ``findings`` with the attribution (and
    what was found inside the culprit's op), and the sample's values.
    """
    settings, arrays, ops = sample.settings, sample.arrays, sample.ops
    pairs, bisection, segments = sample.pairs, sample.bisection, sample.segments
    torch_capture, onnx_capture, float64 = (sample.torch_capture, sample.onnx_capture,
                                            sample.float64)
    prepared, candidate = settings.prepared, settings.prepared.candidate
    program = getattr(ops, "program", None) or prepared.program  # one call's, or the model's
    values = SampleValues(
        reference={pair.candidate.name: pair.reference.array for pair in pairs},
        candidate={name: value.array for name, value in onnx_capture.values.items()})
    if bisection is not None:  # values only the probes fetched
        values.reference.update(bisection.references)
        values.candidate.update({name: value.array for name, value
                                 in bisection.capture.values.items()})
    # Attributed afresh: what an earlier attribution found is not carried over.
    findings = replace(findings, attribution=None, refinement=None)
    report = Reading(findings)
    if not (report.diverged or report.hidden_divergences):  # hidden ones have culprits too
        return findings, values
    script = isinstance(ops, ScriptOpCapture)  # op names are not ONNX value names there
    module_level = float64 is not None and ops is None  # PyTorch's side is its module calls
    attribution, local_values = attribute_divergence(
        report, candidate, SampleArrays(values.reference, values.candidate,
                                        graph_inputs(candidate, arrays)),
        tolerance=settings.judge, everything=settings.all_culprits, evidence=Evidence(
            program=program, ops=None if script else ops,
            modules=(torch_capture, prepared.call_index),
            kernel_references=(references_by_onnx_value(segments, ops, candidate.nodes,
                                                         candidate.opset)
                               if script else None),
            compare=settings.judge.local_comparer(report, values.reference),
            torch_float64=float64 if module_level else None, op_segments=segments,
            training=in_training_mode(settings.reference.exportable)))
    findings = replace(findings, attribution=attribution)
    report = Reading(findings)
    refinement = None
    if module_level:  # no op values: look inside the culprit's op without them
        inside = look_inside_module_culprit(
            report, candidate, settings.reference.exportable,
            {**values.reference, **graph_inputs(candidate, arrays)},
            {**values.candidate, **local_values}, tolerance=settings.judge)
        refinement = replace(inside or Refinement(), fx_nodes=name_the_ops(report, candidate))
    elif (report.coverage.granularity == Granularity.OP and report.first_divergence is not None
            and prepared.template is None):
        # The culprit's own nodes on exact inputs hold the values a fused capture
        # leaves out; the captured ones serve otherwise.
        refinement = look_inside_first_divergence(
            report, segments, ops, program, candidate.model,
            {**values.candidate, **local_values}, opset=candidate.opset,
            tolerance=settings.judge)
    return replace(findings, refinement=refinement), values


def graph_inputs(candidate: Runner, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The sample's arrays by the ONNX graph's input names."""
    return {spec.name: array for spec, array in zip(candidate.inputs, arrays, strict=True)}
