"""One ONNX-against-ONNX sample as a list of stages over an :class:`OnnxSample`.

The same framework as the PyTorch form (:mod:`bisect_onnx.pipeline.stages`), and the
same runtime stages (the capture checked against production, production probed where
the capture cannot show the first divergence): the reference model's values, the
candidate's capture, the values paired and compared, production probed, the values
gathered, the culprit attributed, the run described, and the fix searches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.judge.assembly import assemble
from bisect_onnx.judge.findings import Findings, RunDescription
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Report
from bisect_onnx.pipeline.environment import environment
from bisect_onnx.pipeline.fix_onnx import onnx_sample_fixes
from bisect_onnx.pipeline.onnx_comparison import (
    Paired,
    as_candidate_values,
    compare_onnx_sample,
    kernel_references,
    local_judge,
    probe_checkpoints,
    show_kernel_culprit,
)
from bisect_onnx.pipeline.production import (
    CandidateRun,
    capture_warning,
    probe_production,
    run_candidate,
    wants_probes,
)
from bisect_onnx.pipeline.stages import Stage, run_stages
from bisect_onnx.report.context import culprit_context
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture, SampleArrays
from bisect_onnx.search.blame import Evidence, attribute_divergence
from bisect_onnx.search.local import boundary_references

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.align.onnx_pairs import ValuePair
    from bisect_onnx.align.quantization import Conversion
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.judge.tolerances import ToleranceRule
    from bisect_onnx.pipeline.options import FixOptions

__all__ = ["OnnxSample", "OnnxModels", "ONNX_STAGES", "run_onnx_sample"]


@dataclass(frozen=True)
class OnnxModels:
    """The two models of one run, and the settings every sample shares."""

    reference: Runner
    """The reference: its runtime with every value promoted, or the evaluator."""
    labels: tuple[str, str]
    rtol: float | None
    atol: float | None
    rules: Sequence[ToleranceRule]
    all_culprits: bool
    fixes: FixOptions
    user_paths: tuple[object, ...] = ()
    converted: Mapping[str, Conversion] = field(default_factory=dict)
    """Reference values compared with their candidate value only once converted, by
    candidate name (a recorded reference's: it pairs by name)."""


@dataclass(frozen=True)
class OnnxSample:
    """What one ONNX-against-ONNX sample has found so far; each stage returns a new one."""

    models: OnnxModels
    candidate: Runner
    """The runtime under test (a promote-all one once a fallback was needed)."""
    arrays: list[np.ndarray]
    """The reference graph's inputs."""
    candidate_arrays: list[np.ndarray]
    """The same inputs in the candidate's input types."""
    description: str
    fell_back: str | None = None
    """The promote-all fallback's warning, said in every sample once it happened."""
    memory_reason: str | None = None
    """Why values are probed instead of captured (a check over its memory budget)."""
    reference_capture: Capture | None = None
    run: CandidateRun | None = None
    paired: Paired | None = None
    findings: Findings | None = None
    pairs: tuple[ValuePair, ...] = ()
    """The value pairs compared (and those the probes added); once the values are
    gathered, the final outputs' pairs too: what local checks judge."""
    candidate_values: dict[str, np.ndarray] = field(default_factory=dict)
    values: SampleArrays | None = None
    report: Report | None = None


def run_onnx_sample(sample: OnnxSample) -> OnnxSample:
    """One sample through :data:`ONNX_STAGES`."""
    return run_stages(ONNX_STAGES, sample)


def _capture_reference(sample: OnnxSample) -> OnnxSample:
    """Every value of the reference model."""
    reference = sample.models.reference
    emit(CAPTURE_STARTED, reference.reference_label
         or f"{display_name(reference.runtime)} (reference)")
    return replace(sample, reference_capture=reference.run(sample.arrays).capture)


def _run_runtime(sample: OnnxSample) -> OnnxSample:
    """The candidate's capture and production's final outputs (every value where few survive)."""
    emit(CAPTURE_STARTED, display_name(sample.candidate.runtime))
    run = run_candidate(sample.candidate, sample.candidate_arrays, fall_back=True)
    return replace(sample, run=run, candidate=run.side,
                   fell_back=sample.fell_back or run.fallback)


def _compare(sample: OnnxSample) -> OnnxSample:
    """Pair the values and compare them: production's final outputs give the verdict."""
    comparison, paired = compare_onnx_sample(sample)
    return replace(sample, findings=Findings(comparison), paired=paired,
                   pairs=tuple(paired.pairs),
                   candidate_values={name: value.array
                                     for name, value in sample.run.capture.values.items()})


def _wants_probes(sample: OnnxSample) -> bool:
    return wants_probes(Reading(sample.findings), sample.run, sample.paired.judge.base)


def _probe_production(sample: OnnxSample) -> OnnxSample:
    """Production probed where the capture may not show the first divergence."""
    paired = sample.paired
    plan = probe_checkpoints(paired, sample.candidate, sample.reference_capture)
    probed = probe_production(Reading(sample.findings), sample.run, sample.candidate_arrays,
                              plan.checkpoints, tolerance=paired.judge.base,
                              compare=plan.compare, make_row=plan.make_row)
    if probed is None:
        return sample
    bisection, search = probed
    known = {pair.candidate for pair in sample.pairs}
    return replace(
        sample, findings=replace(sample.findings, search=search),
        pairs=(*sample.pairs, *(pair for pair in plan.pairs if pair.candidate not in known)),
        candidate_values={**sample.candidate_values,
                          **{name: value.array for name, value
                             in bisection.capture.values.items()}})


def _gather_values(sample: OnnxSample) -> OnnxSample:
    """Both models' values under the candidate's names, what local checks feed."""
    reference, candidate = sample.models.reference, sample.candidate
    candidate_values = {**sample.candidate_values,
                        **{value.name: value.array for value in sample.run.production}}
    pairs = (*sample.pairs, *sample.paired.outputs)
    reference_capture = sample.reference_capture
    values = SampleArrays(
        reference=boundary_references(  # one file: the reference's values fit as they are
            candidate, as_candidate_values(list(pairs), reference_capture, candidate_values),
            {name: value.array for name, value in reference_capture.values.items()}
            if reference.path == candidate.path else {}),
        candidate=candidate_values,
        graph_inputs={spec.name: array for spec, array in zip(candidate.inputs,
                                                               sample.candidate_arrays,
                                                               strict=True)})
    return replace(sample, pairs=pairs, candidate_values=candidate_values, values=values)


def _diverged(sample: OnnxSample) -> bool:
    reading = Reading(sample.findings)
    return reading.diverged or bool(reading.hidden_divergences)  # hidden ones have culprits too


def _attribute(sample: OnnxSample) -> OnnxSample:
    """Which node introduced the error, each fed the reference's values."""
    paired, values = sample.paired, sample.values
    attribution, local_values = attribute_divergence(
        Reading(sample.findings), sample.candidate,
        values,
        tolerance=paired.judge, everything=sample.models.all_culprits, evidence=Evidence(
            has_counterpart=_in_graph(sample.models.reference.model),
            compare=local_judge(paired.judge, list(sample.pairs), sample.reference_capture),
            kernel_references=kernel_references(paired, sample.reference_capture)))
    if attribution is None:
        return sample
    return replace(sample, findings=replace(sample.findings, attribution=show_kernel_culprit(
        attribution, paired, sample.reference_capture, local_values)))


def _describe(sample: OnnxSample) -> OnnxSample:
    """What was compared, how, and where."""
    models, candidate, run = sample.models, sample.candidate, sample.run
    reference, base = models.reference, sample.paired.judge.base
    reading = Reading(sample.findings)
    capture = candidate.describe_capture(run.production_check)
    warning = capture_warning(run.production_check, capture,
                              share=run.tolerance_used(base.rtol, base.atol))
    findings = replace(sample.findings, description=RunDescription(
        environment=environment(candidate, exporter="unknown",
                                reference=_reference_runtime(reference)),
        reference={**reference.describe(), "model": models.labels[0],
                   "inputs": sample.description},
        candidate={**candidate.describe(), "model": models.labels[1]},
        capture=capture,
        culprit_node=culprit_context(reading.culprit or reading.first_divergence,
                                     candidate, sample.reference_capture,
                                     run.judged_capture(), reading.comparisons),
        warnings=(warning,) if warning else ()))
    return replace(sample, findings=findings)


def _suggest_fixes(sample: OnnxSample) -> OnnxSample:
    """The ONNX fix searches' checked results for the culprit."""
    fixes, notes = onnx_sample_fixes(sample)
    return replace(sample, findings=replace(sample.findings, fixes=fixes, fix_notes=notes))


def _lay_out(sample: OnnxSample) -> OnnxSample:
    """The sample's report, laid out of everything its stages found: once."""
    return replace(sample, report=assemble(sample.findings))


def _in_graph(model: onnx.ModelProto) -> Callable[[NodeInfo], bool]:
    """Whether a candidate node is one the reference graph holds (by name)."""
    names = {node.name for node in model.graph.node if node.name}
    return lambda node: node.name in names


def _reference_runtime(reference: Runner) -> dict[str, Any]:
    """How the reference ran, for the environment record."""
    return {"reference_runtime": reference.reference_label or reference.runtime,
            "reference_provider": reference.provider,
            "reference_opt_level": reference.opt_level}


#: An ONNX-against-ONNX sample's stages, in order.
ONNX_STAGES: Sequence[Stage[OnnxSample]] = (
    Stage("capture the reference's values", _capture_reference),
    Stage("run the runtime", _run_runtime),
    Stage("pair and compare", _compare),
    Stage("probe production", _probe_production, _wants_probes),
    Stage("gather the values", _gather_values),
    Stage("attribute the culprit", _attribute, _diverged),
    Stage("describe the run", _describe),
    Stage("suggest fixes", _suggest_fixes, lambda sample: sample.models.fixes.suggest),
    Stage("lay out the report", _lay_out),
)
