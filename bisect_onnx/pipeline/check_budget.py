"""A check over its memory budget: production probed, the recorded values read one at a time.

As the run with PyTorch does (:func:`~bisect_onnx.search.modes.over_budget`), a check
whose values would not fit in the memory budget twice (the recorded side and the
runtime's) captures none: production's final outputs are compared with the recorded
ones, and where they diverge production is probed a few values at a time for the first
divergence (:class:`~bisect_onnx.search.probes.ProbeRunner`, as many values per probe
as the budget leaves). Each recorded value is read from the archive when its probe
asks, compared, and let go: the archive is never read whole. The values the probes
found are then compared as a capture's would be, and the culprit searched among them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.onnx_pairs import ValuePair
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.graph.nodes import node_provenance
from bisect_onnx.judge.compare import ArrayComparison
from bisect_onnx.judge.reading import Reading
from bisect_onnx.pipeline.onnx_sample import ONNX_STAGES, OnnxSample
from bisect_onnx.pipeline.production import memory_bisection, nothing_fetched, run_candidate
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.modes import over_budget
from bisect_onnx.search.probes import Checkpoint

if TYPE_CHECKING:
    from bisect_onnx.pipeline.check_stages import CheckModels
    from bisect_onnx.reference.loaded import Reference

__all__ = ["capture_recorded", "run_within_budget", "probe_over_budget", "over_the_budget",
           "captured_within_budget"]


def _stage_run(name: str):
    return next(stage.run for stage in ONNX_STAGES if stage.name == name)


_CAPTURE_ALL = _stage_run("capture the reference's values")
_RUN_ALL = _stage_run("run the runtime")
_COMPARE = _stage_run("pair and compare")


def capture_recorded(sample: OnnxSample) -> OnnxSample:
    """Every recorded value; over the budget, the recorded final outputs only."""
    models: CheckModels = sample.models  # type: ignore[assignment] (a check's models)
    reason = over_budget(sample.candidate, sample.candidate_arrays, models.budget)
    if not reason:
        return _CAPTURE_ALL(sample)
    reference = models.reference
    emit(CAPTURE_STARTED, reference.reference_label or reference.runtime)
    return replace(sample, memory_reason=reason, reference_capture=Capture(
        values={}, outputs=reference.run_outputs(sample.arrays)))


def run_within_budget(sample: OnnxSample) -> OnnxSample:
    """The runtime's capture; over the budget, production's final outputs only."""
    if not sample.memory_reason:
        return _RUN_ALL(sample)
    emit(CAPTURE_STARTED, display_name(sample.candidate.runtime))
    return replace(sample, run=run_candidate(sample.candidate, sample.candidate_arrays,
                                             memory_reason=sample.memory_reason))


def over_the_budget(sample: OnnxSample) -> bool:
    """Whether the sample's values are probed instead of captured."""
    return bool(sample.memory_reason)


def captured_within_budget(sample: OnnxSample) -> bool:
    """Whether the sample's values were captured (the budget let them be)."""
    return not sample.memory_reason


def probe_over_budget(sample: OnnxSample) -> OnnxSample:
    """Production probed for the first divergence, each recorded value read as asked.

    At parity only the final outputs were computed, and the report says so.
    """
    reason, run = sample.memory_reason, sample.run
    if not Reading(sample.findings).diverged:
        return replace(sample, findings=replace(sample.findings, search=nothing_fetched(
            Reading(sample.findings), reason)))
    models: CheckModels = sample.models  # type: ignore[assignment] (a check's models)
    loaded: Reference = models.recorded
    paired, candidate = sample.paired, sample.candidate
    pairs: dict[str, ValuePair] = {}
    checkpoints = []
    for node in candidate.nodes:
        for output in node.outputs:
            entry = loaded.value_entry(output)
            if entry is None or np.dtype(entry.dtype).kind not in "fc" or output in pairs:
                continue
            pairs[output] = ValuePair(output, output, node.name, "name",
                                      paired.groups.quantization(output))
            # Shaped as the recorded value, and holding nothing: what the probes count
            # (values_per_probe) without the archive being read.
            placeholder = np.broadcast_to(np.zeros((), entry.dtype), entry.shape)
            shown = node_provenance(node, node.index)
            checkpoints.append(Checkpoint(output, CapturedValue(output, placeholder, shown),
                                          node))
    if not checkpoints:
        return replace(sample, findings=replace(sample.findings, search=nothing_fetched(
            Reading(sample.findings), reason)))

    def compare(checkpoint: Checkpoint, array: np.ndarray) -> ArrayComparison:
        pair = pairs[checkpoint.name]
        return paired.judge.compare(loaded.value(checkpoint.name), array, pair,
                                    paired.judge.tolerance(pair))[0]

    base = paired.judge.base
    bisection = run.runner.bisect(checkpoints, rtol=base.rtol, atol=base.atol,
                                  compare=compare, memory_budget=models.budget)
    probed = _recorded_capture(loaded, bisection.capture, sample.reference_capture)
    compared = _COMPARE(replace(sample, run=replace(run, capture=bisection.capture),
                                reference_capture=probed))
    return replace(compared, findings=replace(compared.findings, search=memory_bisection(
        Reading(compared.findings), bisection, reason)))


def _recorded_capture(loaded: Reference, probed: Capture, recorded: Capture) -> Capture:
    """The recorded values of the values the probes found, with the recorded outputs."""
    return Capture(values={name: CapturedValue(name, loaded.value(name), value.provenance)
                           for name, value in probed.values.items()},
                   outputs=recorded.outputs)

