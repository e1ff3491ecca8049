"""A check's stages: ONNX against ONNX's, attributed with the recording's op segments.

The list is :data:`~bisect_onnx.pipeline.onnx_sample.ONNX_STAGES` with two changes: the
culprit is attributed knowing which ONNX nodes each torch op became (recorded, where
the file's nodes carry no metadata saying so: a TorchScript export), and the rows are
shown as the recording showed them before the report is laid out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.judge.reading import Reading
from bisect_onnx.pipeline.check_budget import (
    capture_recorded,
    captured_within_budget,
    over_the_budget,
    probe_over_budget,
    run_within_budget,
)
from bisect_onnx.pipeline.onnx_comparison import (
    kernel_references,
    local_judge,
    show_kernel_culprit,
)
from bisect_onnx.pipeline.onnx_sample import ONNX_STAGES, OnnxModels, OnnxSample
from bisect_onnx.pipeline.recorded_rows import show_recorded_rows
from bisect_onnx.pipeline.stages import Stage
from bisect_onnx.reference.loaded import Reference
from bisect_onnx.reference.manifest import Manifest
from bisect_onnx.search.blame import Evidence, attribute_divergence

__all__ = ["CheckModels", "CHECK_STAGES"]


@dataclass(frozen=True)
class CheckModels(OnnxModels):
    """The two sides of a check: the recorded reference, and what its manifest says."""

    manifest: Manifest | None = None
    other_file: str | None = None
    """Why the file is not the recorded graph, where ``--allow-other-file`` let it be."""
    tolerance_basis: str | None = None
    """Why the tolerance follows a precision narrower than float32, where it does."""
    op_segments: Mapping[str, Sequence[NodeInfo]] = field(default_factory=dict)
    """The recording's ops, each with the candidate nodes it became."""
    recorded: Reference | None = None
    """The archive, whose values are read one at a time over the budget."""
    budget: int | None = None
    """The memory budget: over it, production's values are probed, the recorded ones
    read one at a time (:mod:`bisect_onnx.pipeline.check_budget`)."""


def _attribute(sample: OnnxSample) -> OnnxSample:
    """Which node introduced the error, each fed PyTorch's recorded values.

    As ONNX against ONNX attributes, with the recording's op segments: a check of the
    nodes of one torch op isolates that op.
    """
    models: CheckModels = sample.models  # type: ignore[assignment] (a check's models)
    paired, values = sample.paired, sample.values
    counterparts = models.manifest.counterparts if models.manifest is not None else None
    named = (set(counterparts) if counterparts is not None  # a reference ONNX file's nodes
             else {node.name for node in models.reference.model.graph.node if node.name})
    attribution, local_values = attribute_divergence(
        Reading(sample.findings), sample.candidate, values, tolerance=paired.judge,
        everything=models.all_culprits, evidence=Evidence(
            has_counterpart=lambda node: node.name in named,
            compare=local_judge(paired.judge, list(sample.pairs), sample.reference_capture),
            kernel_references=kernel_references(paired, sample.reference_capture),
            op_segments=models.op_segments or None))
    if attribution is None:
        return sample
    return replace(sample, findings=replace(sample.findings, attribution=show_kernel_culprit(
        attribution, paired, sample.reference_capture, local_values)))


def _stage(name: str) -> Stage[OnnxSample]:
    return next(stage for stage in ONNX_STAGES if stage.name == name)


def _wants_probes(sample: OnnxSample) -> bool:
    return captured_within_budget(sample) and _PROBE.applies(sample)


_CAPTURE, _RUN = _stage("capture the reference's values"), _stage("run the runtime")
_COMPARE, _PROBE = _stage("pair and compare"), _stage("probe production")
_ATTRIBUTE = _stage("attribute the culprit")
#: Each of ONNX against ONNX's stages a check runs otherwise.
_CHANGED = {_CAPTURE: replace(_CAPTURE, run=capture_recorded),
            _RUN: replace(_RUN, run=run_within_budget),
            _PROBE: replace(_PROBE, applies=_wants_probes),
            _ATTRIBUTE: replace(_ATTRIBUTE, run=_attribute)}

#: A check's stages, in order.
CHECK_STAGES: tuple[Stage[OnnxSample], ...] = (
    *(_CHANGED.get(stage, stage) for stage in ONNX_STAGES[:ONNX_STAGES.index(_COMPARE) + 1]),
    Stage("probe over the memory budget", probe_over_budget, over_the_budget),
    *(_CHANGED.get(stage, stage)
      for stage in ONNX_STAGES[ONNX_STAGES.index(_COMPARE) + 1:-1]),
    Stage("show the recorded rows", show_recorded_rows),
    ONNX_STAGES[-1],
)
