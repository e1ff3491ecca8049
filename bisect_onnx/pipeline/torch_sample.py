"""One PyTorch-form sample as a list of stages: :data:`TORCH_STAGES` over a :class:`TorchSample`.

Read top to bottom, the list is the data flow: PyTorch's values, the runtime's
capture and production's final outputs, the verdict's outputs judged, op values
where the program is at hand, production bisected over the memory budget, values
aligned and compared, op values traced later for a divergence found at module
level, production probed where the capture cannot show the first divergence, the
culprit attributed, the run described, and the fix searches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.align.op_level import align_op_values
from bisect_onnx.errors import RuntimeRefused
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.judge.assembly import assemble
from bisect_onnx.judge.findings import Findings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record, Report
from bisect_onnx.judge.vocabulary import Granularity
from bisect_onnx.pipeline.baked_check import (
    find_baked_shapes,
    may_be_baked,
    outputs_of,
    records_of,
    refused_error,
    with_baked,
)
from bisect_onnx.pipeline.call_ops import alignment_inputs, op_scope, traces_one_call
from bisect_onnx.pipeline.description import describe_run
from bisect_onnx.pipeline.fix_torch import torch_sample_fixes
from bisect_onnx.pipeline.module_float64 import ModuleFloat64, module_float64
from bisect_onnx.pipeline.op_sources import later_op_values, op_values
from bisect_onnx.pipeline.production import (
    CandidateRun,
    memory_bisection,
    nothing_fetched,
    probe_production,
    run_candidate,
    wants_probes,
)
from bisect_onnx.pipeline.repro import write_torch_repro
from bisect_onnx.pipeline.stages import Stage, run_stages
from bisect_onnx.pipeline.torch_attribution import SampleValues, attribute_sample, graph_inputs
from bisect_onnx.pipeline.torch_comparison import (
    ANOTHER_MODEL,
    FOREIGN_FILE,
    NO_OP_LEVEL,
    compare_final_outputs,
    compare_torch_sample,
    subgraph_warnings,
)
from bisect_onnx.pipeline.torch_settings import Settings
from bisect_onnx.pytorch.exporter_imports import imported_meanwhile
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.pytorch.whose_export import check_file_identity
from bisect_onnx.runtime.heap import kept_in_heap
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture
from bisect_onnx.search.baked_shapes import BakedShapes
from bisect_onnx.search.modes import (
    MEMORY_NO_OPS,
    bisect_production,
    over_budget,
    references_by_value,
)
from bisect_onnx.search.probes import ProbeBisection, checkpoints_for
from bisect_onnx.sources.graph_inputs import check_against_onnx

__all__ = ["TorchSample", "TORCH_STAGES", "run_torch_sample", "repro_writer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TorchSample:
    """What one PyTorch-form sample has found so far; each stage returns a new one."""

    settings: Settings
    arrays: list[np.ndarray]
    description: str
    memory_reason: str | None = None
    """Why values are probed rather than captured (over the memory budget), if they are."""
    torch_capture: Capture | None = None
    run: CandidateRun | None = None
    warnings: tuple[str, ...] = ()
    final_outputs: tuple[Record, ...] = ()
    """Production's final outputs judged against PyTorch's: the verdict."""
    ops: OpCapture | None = None
    onnx_capture: Capture | None = None
    """The runtime's values aligned: the capture's, or the memory bisection's probes'."""
    bisection: ProbeBisection | None = None
    findings: Findings | None = None
    pairs: tuple[Pair, ...] = ()
    segments: dict[str, list[NodeInfo]] = field(default_factory=dict)
    float64: ModuleFloat64 | None = None
    attributed: tuple[Findings, SampleValues] | None = None
    """Module-level findings op level cannot refine: the sample's attribution as it is."""
    values: SampleValues | None = None
    baked: BakedShapes | None = None
    """The shapes the export baked in, where the run's are others (checked)."""
    report: Report | None = None

    @property
    def diverged(self) -> bool:
        """Whether a final output is out of tolerance."""
        return any(record.failed for record in self.final_outputs)

    @property
    def candidate(self) -> Runner:
        """The runner of the ONNX file under test."""
        return self.settings.prepared.candidate


def run_torch_sample(settings: Settings, arrays: list[np.ndarray], description: str
                     ) -> tuple[Report, Callable[..., dict[str, Any]]]:
    """One sample through :data:`TORCH_STAGES`: its report, and how to write its repro."""
    sample = run_stages(TORCH_STAGES, TorchSample(settings, arrays, description))
    return sample.report, repro_writer(sample)


def repro_writer(sample: TorchSample) -> Callable[..., dict[str, Any]]:
    """How to write a compared sample's repro into a folder, later."""
    # The repro is written after the sample (every sample's, or the worst one's): what it
    # does not read (op values, the probe runner and its sessions) is let go now.
    kept = replace(sample, run=None, ops=None, bisection=None, float64=None, attributed=None)
    return partial(write_torch_repro, sample=kept)


def _capture_pytorch(sample: TorchSample) -> TorchSample:
    """PyTorch's values: the export's run on these inputs, or a run now."""
    settings, candidate, arrays = sample.settings, sample.candidate, sample.arrays
    check_against_onnx(arrays, candidate.inputs)
    # Known from shapes alone, before either side holds a value.
    memory_reason = over_budget(candidate, arrays, settings.budget)
    prepared = settings.prepared
    if prepared.capture is not None and prepared.ran_on(arrays):
        torch_capture = prepared.capture
    else:
        settings.parking.restore()  # an earlier sample's ONNX Runtime side is gone
        emit(CAPTURE_STARTED, "pytorch")
        torch_capture = settings.reference.side.run(arrays, keywords=prepared.keywords)
    # PyTorch's values are recorded: one copy of the weights (the file's, where it holds them)
    settings.parking.park(candidate.model, candidate.path.parent, model_file=candidate.path)
    return replace(sample, memory_reason=memory_reason, torch_capture=torch_capture)


def _run_runtime(sample: TorchSample) -> TorchSample:
    """The runtime's capture and production's final outputs (or probes over the budget)."""
    settings, candidate = sample.settings, sample.candidate
    emit(CAPTURE_STARTED, display_name(candidate.runtime))
    # The translations (for inside_op), imported while the capture is made.
    with (imported_meanwhile(candidate.model, wanted=_imports_meanwhile(sample)),
          kept_in_heap(settings.parking.parked)):  # its pages kept for the weights read back
        try:
            run = run_candidate(candidate, sample.arrays, memory_reason=sample.memory_reason)
        except RuntimeRefused as error:  # named by its node, module and line; a baked shape?
            raise refused_error(settings, sample.arrays,
                                outputs_of(sample.torch_capture.outputs), error) from error
    return replace(sample, run=run)


def _imports_meanwhile(sample: TorchSample) -> bool:
    """Whether the exporter's translations are imported while the capture is made.

    Beside ONNX Runtime's sessions, made on one core, wherever a culprit's op may be
    looked inside. OpenVINO's compilations take every core: there only where
    production's final outputs, run first, already diverge (the runner keeps them for
    the capture's check, so nothing runs twice; at parity the import would spend 1.3 s
    of CPU for nothing, and beside the capture's compilation it hides 0.6 s to 0.9 s of
    BERT-base's diverged run).
    """
    settings, candidate = sample.settings, sample.candidate
    if not traces_one_call(settings) or sample.memory_reason:
        return False
    if candidate.prepares_on_one_core:
        return True
    early = compare_final_outputs(sample.torch_capture.outputs,
                                  candidate.run_outputs(sample.arrays),
                                  judge=settings.judge, warnings=[])
    return any(record.failed for record in early)


def _judge_outputs(sample: TorchSample) -> TorchSample:
    """The verdict is production's, whatever the capture session computed."""
    warnings = list(sample.settings.reference.warnings)
    final_outputs = compare_final_outputs(sample.torch_capture.outputs, sample.run.production,
                                          judge=sample.settings.judge, warnings=warnings)
    return replace(sample, final_outputs=tuple(final_outputs), warnings=tuple(warnings))


def _check_whose_file(sample: TorchSample) -> TorchSample:
    """Whether the file the user gave is this model's export, its outputs being off."""
    candidate = sample.candidate
    identity = check_file_identity(sample.settings.reference.exportable, candidate.model,
                                   candidate.nodes, candidate.path.resolve().parent)
    why = identity.another_model
    if why is None:
        return sample
    return replace(sample, warnings=(*sample.warnings, ANOTHER_MODEL.format(why=why)))


def _given_and_diverged(sample: TorchSample) -> bool:
    return sample.diverged and sample.settings.prepared.source != "exported here"


def _op_values(sample: TorchSample) -> TorchSample:
    """Every ATen op's value, where the program the exporter translated is at hand."""
    return replace(sample, ops=op_values(sample.settings, sample.arrays,
                                         diverged=sample.diverged,
                                         memory_reason=sample.memory_reason))


def _bisect_over_budget(sample: TorchSample) -> TorchSample:
    """Over the memory budget, production's values probed for the first divergence."""
    settings = sample.settings
    bisection = bisect_production(sample.run.runner, sample.candidate,
                                  references_by_value([], sample.ops), rtol=settings.rtol,
                                  atol=settings.atol, memory_budget=settings.budget)
    if bisection is None:
        return replace(sample, warnings=(*sample.warnings, MEMORY_NO_OPS))
    return replace(sample, bisection=bisection)


def _compare(sample: TorchSample) -> TorchSample:
    """Align op and module values, compare them, decide: the sample's first findings."""
    onnx_capture = (sample.bisection.capture if sample.bisection is not None
                    else sample.run.capture)
    findings, pairs, segments = _aligned_findings(replace(sample, onnx_capture=onnx_capture))
    return replace(sample, onnx_capture=onnx_capture, findings=findings, pairs=tuple(pairs),
                   segments=segments)


def _aligned_findings(sample: TorchSample
                      ) -> tuple[Findings, list[Pair], dict[str, list[NodeInfo]]]:
    """The comparison of the sample's values at op level where it has ops, else modules."""
    settings, ops, onnx_capture = sample.settings, sample.ops, sample.onnx_capture
    prepared, candidate = settings.prepared, settings.prepared.candidate
    warnings = list(sample.warnings)
    op_alignment = None
    if ops is not None:
        op_alignment = align_op_values(
            ops, *alignment_inputs(ops, candidate.nodes, onnx_capture.values),
            template=prepared.template,
            foreign=candidate.model, foreign_dir=candidate.path.resolve().parent,
            graph_inputs=graph_inputs(candidate, sample.arrays),
            tolerance=settings.judge.base)
    if settings.granularity == Granularity.OP and ops is None:
        warnings.append(NO_OP_LEVEL)
    if prepared.template is not None:
        warnings.append(FOREIGN_FILE)
    comparison, pairs, segments = compare_torch_sample(
        sample, op_alignment, warnings=warnings,
        granularity=Granularity.OP if ops is not None and settings.granularity != Granularity.MODULE
        else Granularity.MODULE, op_scope=op_scope(ops, onnx_capture.values))
    return Findings(comparison), pairs, segments


def _module_float64(sample: TorchSample) -> TorchSample:
    """How a module call around a culprit's segment reruns in float64 (module level)."""
    settings = sample.settings
    return replace(sample, float64=module_float64(
        settings.reference, sample.arrays, settings.prepared.keywords,
        graph_inputs(sample.candidate, sample.arrays), list(sample.pairs)))


def _wants_later_ops(sample: TorchSample) -> bool:
    """A divergence (a hidden one has a culprit too) found without op values.

    Or, at default granularity, no module call to compare (a model whose ``forward``
    calls ops only): its ops are all that can be checked inside it.
    """
    if sample.ops is not None or sample.memory_reason:
        return False
    reading = Reading(sample.findings)
    return (sample.diverged or bool(reading.hidden_divergences)
            or sample.settings.granularity is None and not reading.comparisons)


def _later_ops(sample: TorchSample) -> TorchSample:
    """Op precision for a divergence module level found: its call traced, or the model."""
    ops, attributed = later_op_values(
        sample.settings, sample.arrays, Reading(sample.findings),
        (sample.torch_capture, sample.onnx_capture), list(sample.pairs), sample.run,
        attribute=partial(_attribute, replace(sample, bisection=None)))
    findings = attributed[0] if attributed is not None else sample.findings
    sample = replace(sample, ops=ops, attributed=attributed, findings=findings)
    if ops is None:
        return sample
    findings, pairs, segments = _aligned_findings(sample)
    return replace(sample, findings=findings, pairs=tuple(pairs), segments=segments)


def _search_production(sample: TorchSample) -> TorchSample:
    """Say how production was searched; probe it where the capture may not show it."""
    settings, findings, bisection = sample.settings, sample.findings, sample.bisection
    report = Reading(findings)
    if bisection is not None:
        search = memory_bisection(report, bisection, sample.memory_reason)
    elif sample.memory_reason:
        search = nothing_fetched(report, sample.memory_reason)
    elif wants_probes(report, sample.run, settings.judge.base):
        references = references_by_value(list(sample.pairs), sample.ops)
        probed = probe_production(report, sample.run, sample.arrays,
                                  checkpoints_for(sample.candidate, references),
                                  tolerance=settings.judge.base,
                                  compare=settings.judge.probe_comparer())
        if probed is None:
            return sample
        bisection, search = probed
    else:
        return sample
    return replace(sample, findings=replace(findings, search=search), bisection=bisection)


def _attribute_culprit(sample: TorchSample) -> TorchSample:
    """Which node introduced the error, on PyTorch's inputs (the graph's warnings first)."""
    sample = replace(sample, findings=replace(
        sample.findings, warnings=tuple(subgraph_warnings(sample.candidate.model))))
    if sample.attributed is not None and sample.bisection is None:
        return replace(sample, values=sample.attributed[1])
    findings, values = _attribute(sample, sample.findings)
    return replace(sample, findings=findings, values=values)


def _attribute(sample: TorchSample, findings: Findings) -> tuple[Findings, SampleValues]:
    """``findings`` attributed with the sample's values (module level where ``ops`` is None)."""
    return attribute_sample(sample, findings)


def _may_be_baked(sample: TorchSample) -> bool:
    attribution = sample.findings.attribution
    evidence = attribution.evidence if attribution is not None else {}
    kind = (evidence.get("classification") or {}).get("kind")
    return sample.diverged and may_be_baked(sample.settings, sample.arrays, classified=kind)


def _check_baked_shapes(sample: TorchSample) -> TorchSample:
    """Whether the export baked in the shapes it was made at: an export at these, checked."""
    baked = find_baked_shapes(sample.settings, sample.arrays,
                              outputs_of(sample.torch_capture.outputs),
                              records=records_of(sample.findings))
    if baked is None:
        return sample
    return replace(sample, baked=baked, findings=with_baked(sample.findings, baked))


def _describe(sample: TorchSample) -> TorchSample:
    """What was compared, how, and where."""
    description = describe_run(sample, Reading(sample.findings))
    return replace(sample, findings=replace(sample.findings, description=description))


def _suggest_fixes(sample: TorchSample) -> TorchSample:
    """The fix searches' checked results for the culprit."""
    fixes, notes = torch_sample_fixes(Reading(sample.findings), sample.settings,
                                      sample.arrays, sample.torch_capture.outputs,
                                      sample.run.production, baked=sample.baked)
    return replace(sample, findings=replace(sample.findings, fixes=fixes, fix_notes=notes))


def _lay_out(sample: TorchSample) -> TorchSample:
    """The sample's report, laid out of everything its stages found: once."""
    return replace(sample, report=assemble(sample.findings))


def _over_budget_and_diverged(sample: TorchSample) -> bool:
    return bool(sample.memory_reason) and sample.diverged


#: A PyTorch-form sample's stages, in order.
TORCH_STAGES: Sequence[Stage[TorchSample]] = (
    Stage("capture PyTorch's values", _capture_pytorch),
    Stage("run the runtime", _run_runtime),
    Stage("judge the final outputs", _judge_outputs),
    Stage("check the file is the model's export", _check_whose_file, _given_and_diverged),
    Stage("op values", _op_values),
    Stage("bisect production over the memory budget", _bisect_over_budget,
          _over_budget_and_diverged),
    Stage("align and compare", _compare),
    Stage("module calls in float64", _module_float64),
    Stage("op values for a divergence", _later_ops, _wants_later_ops),
    Stage("search production", _search_production),
    Stage("attribute the culprit", _attribute_culprit),
    Stage("check for baked shapes", _check_baked_shapes, _may_be_baked),
    Stage("describe the run", _describe),
    Stage("suggest fixes", _suggest_fixes, lambda sample: sample.settings.fixes.suggest),
    Stage("lay out the report", _lay_out),
)
