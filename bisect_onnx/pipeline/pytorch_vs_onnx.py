"""PyTorch against ONNX: the public ``bisect``, one sample at a time through the stages.

Data flows one way: prepare the ONNX model (export or given file), then per sample
capture both sides, compare, search production where the capture cannot show the
first divergence, attribute it, and describe the run. Each step lives in its own
module; this one wires them.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.op_level import align_op_values
from bisect_onnx.events import BISECTION_STARTED, CAPTURE_STARTED, emit
from bisect_onnx.judge.assembly import assemble
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.judge.findings import Findings
from bisect_onnx.judge.records import Report
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.vocabulary import Granularity
from bisect_onnx.pipeline.call_ops import alignment_inputs, op_scope, traces_one_call
from bisect_onnx.pipeline.description import describe_run
from bisect_onnx.pipeline.fix_torch import sample_fixes
from bisect_onnx.pipeline.module_float64 import module_float64
from bisect_onnx.pipeline.op_sources import later_op_values, op_values
from bisect_onnx.pipeline.options import (
    ExportOptions,
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.prepare import (
    PreparedCandidate,
    arrange_for,
    prepare_candidate,
    resolve_export,
)
from bisect_onnx.pipeline.production import (
    memory_bisection,
    nothing_fetched,
    probe_production,
    run_candidate,
    wants_probes,
)
from bisect_onnx.pipeline.repro import write_torch_repro
from bisect_onnx.pipeline.samples import (
    RANDOM_SAMPLES,
    compare_samples,
    given_input_sets,
    random_samples,
    samples_kind,
)
from bisect_onnx.pipeline.torch_attribution import attribute_sample, graph_inputs
from bisect_onnx.pipeline.torch_comparison import (
    FOREIGN_FILE,
    NO_OP_LEVEL,
    compare_final_outputs,
    compare_sample,
    subgraph_warnings,
)
from bisect_onnx.pytorch.exporter_imports import imported_meanwhile
from bisect_onnx.pytorch.fast_paths import as_the_exporter_runs
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.pytorch.parking import WeightParking, parking_for
from bisect_onnx.pytorch.reference import Reference, exit_is_a_model_error, reference_for
from bisect_onnx.runtime.heap import kept_in_heap
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.modes import (
    MEMORY_NO_OPS,
    bisect_production,
    over_budget,
    references_by_value,
)
from bisect_onnx.search.probes import ProbeBisection, checkpoints_for
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.input_sizes import Budget, input_budget
from bisect_onnx.sources.output_paths import check_run_files

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["bisect", "run_prepared", "Settings"]

logger = logging.getLogger(__name__)


@exit_is_a_model_error
def bisect(
    model: Any,
    inputs: Any = None,
    *,
    onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None,
    tolerance: Tolerance | tuple[float, float] | None = None,
    export: ExportOptions | None = None,
    runtime: RuntimeOptions | None = None,
    search: SearchOptions | None = None,
    output: OutputOptions | None = None,
    suggest_fix: bool | FixOptions | None = None,
) -> Report:
    """Compare a PyTorch model with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: An ``nn.Module`` (its train/eval mode is used as given), an
            ``ExportedProgram``, a ``torch.onnx.ONNXProgram`` (its own ONNX model is
            the one tested), a TorchScript module, or a path to a ``.pt2`` or
            TorchScript archive (a whole pickled module is refused: load it yourself
            with ``torch.load(path, weights_only=False)`` if you trust it).
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays;
            :class:`~bisect_onnx.Samples` of several such sets to try each (the report
            is the worst one's); or :class:`~bisect_onnx.RandomInputs` (seed, free
            dimensions, sample count) to draw them from the ONNX graph's input
            specification, which ``None`` does with its defaults.
        onnx_model: An existing export to compare against: a path, an
            ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``. Without it the
            model is exported here (see ``export``).
        tolerance: A :class:`~bisect_onnx.Tolerance` (with per-value rules matched on
            ONNX value, op (FX node) and module call names) or an ``(rtol, atol)``
            pair; an element fails when ``|onnx - torch| > atol + rtol * |torch|``.
            ``None``: ``DEFAULT_RTOL`` and ``DEFAULT_ATOL``.
        export: How to export when no ONNX model is given.
        runtime: Provider, optimization level, promotion and memory budget for ONNX
            Runtime.
        search: Table granularity (``op`` or ``module`` rows; ``None`` picks, see
            :class:`~bisect_onnx.SearchOptions`) and whether to list every culprit.
        output: Where a divergence's standalone repro is written (``repro_dir``;
            ``<dir>/sample-<k>`` for each diverging random sample) and how the report
            names the model (``label``).
        suggest_fix: ``True`` (or a :class:`~bisect_onnx.FixOptions`, which can name a
            ``write_fixed`` path): for the culprit's class, try fixes on a copy and
            rerun; ``report.fixes`` holds each, checked by its rerun.

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    tolerance = Tolerance.of(tolerance)
    judge = tolerance.judge()
    runtime = runtime or RuntimeOptions()
    search = search or SearchOptions()
    output = output or OutputOptions()
    fixes = FixOptions.of(suggest_fix)
    random_inputs = inputs if isinstance(inputs, RandomInputs) else RandomInputs()
    inputs = None if isinstance(inputs, RandomInputs) else inputs
    check_run_files({"output.repro_dir": output.repro_dir,
                     "export.save_to": export and export.save_to},
                    model=model, onnx_models={"onnx_model": onnx_model},
                    tolerances=tolerance.rules, folders={"output.repro_dir"},
                    makes_parents={"export.save_to"})
    from bisect_onnx.fixes.stage import check_write_fixed, write_fixed  # imports onnx: lazily

    check_write_fixed(fixes.write_fixed, (model, onnx_model))
    emit(BISECTION_STARTED, output.label or "")
    reference = reference_for(model, label=output.label)
    export = resolve_export(reference, onnx_model, export)
    given = given_input_sets(inputs)
    with (tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir,
          parking_for(reference.exportable, Path(workdir)) as parking,
          as_the_exporter_runs()):  # attention layers' fast paths have no ONNX graph
        # The export is made on the first input set (and PyTorch's run on it kept).
        prepared = prepare_candidate(reference, given[0][0] if given else None, onnx_model,
                                     export, Path(workdir), runtime)
        settings = Settings(reference, prepared, export, Path(workdir), judge=judge,
                            granularity=search.granularity,
                            all_culprits=search.all_culprits,
                            budget=runtime.budget(),  # what is left once the model is loaded
                            input_budget=input_budget(runtime.max_memory), parking=parking,
                            fixes=fixes)
        report = run_prepared(settings, given, random_inputs, repro_dir=output.repro_dir,
                              kind=samples_kind(inputs))
    return write_fixed(report, fixes.write_fixed, (model, onnx_model))


@dataclass
class Settings:
    """What every sample of one PyTorch-form run shares."""

    reference: Reference
    prepared: PreparedCandidate
    export: ExportOptions
    workdir: Path
    """The run's temporary folder (a template export for a foreign file goes there)."""
    judge: ToleranceJudge = field(
        default_factory=lambda: ToleranceJudge.from_floats(DEFAULT_RTOL, DEFAULT_ATOL))
    """Every value's tolerance: the base, and the user's per-value rules."""
    granularity: str | None = None
    all_culprits: bool = False
    budget: int | None = None
    """Memory the captured values of both sides may take; ``None``: unknown."""
    input_budget: Budget | None = None
    """What one sample's inputs may take (``--max-memory``, else most of the memory)."""
    parking: WeightParking = field(default_factory=lambda: WeightParking(None, Path()))
    """Where a large model's weights wait while ONNX Runtime holds its copy."""
    fixes: FixOptions = field(default_factory=FixOptions)

    @property
    def rtol(self) -> float:
        """The base relative tolerance (a value without a rule of its own)."""
        return self.judge.base.rtol

    @property
    def atol(self) -> float:
        """The base absolute tolerance."""
        return self.judge.base.atol


def run_prepared(settings: Settings, given: list[tuple[Any, str]] | None,
                 random_inputs: RandomInputs, *, repro_dir: str | Path | None,
                 kind: str | None = None) -> Report:
    """Compare every sample against the prepared candidate; the worst sample's report.

    ``given``: the user's input sets with how each is described (see
    :func:`~bisect_onnx.pipeline.samples.given_input_sets`); ``None`` draws ``random_inputs``.
    ``kind``: what the given sets are (:func:`~bisect_onnx.pipeline.samples.samples_kind`).
    """
    candidate = settings.prepared.candidate
    if given is not None:
        samples = [(arrange_for(settings.reference, candidate, inputs), description)
                   for inputs, description in given]
    else:
        samples = random_samples(candidate.inputs, candidate.model, random_inputs,
                                 budget=settings.input_budget)
    return compare_samples(samples, partial(_run_sample, settings), repro_dir=repro_dir,
                           kind=RANDOM_SAMPLES if given is None else kind)


def _imports_meanwhile(settings: Settings, arrays: list[np.ndarray],
                       torch_outputs: Sequence[CapturedValue],
                       memory_reason: str | None) -> bool:
    """Whether the exporter's translations are imported while the capture is made.

    Beside ONNX Runtime's sessions, made on one core, wherever a culprit's op may be
    looked inside. OpenVINO's compilations take every core: there only where
    production's final outputs, run first, already diverge (the side keeps them for the
    capture's check, so nothing runs twice; at parity the import would spend 1.3 s of
    CPU for nothing, and beside the capture's compilation it hides 0.6 s to 0.9 s of
    BERT-base's diverged run).
    """
    candidate = settings.prepared.candidate
    if not traces_one_call(settings) or memory_reason:
        return False
    if candidate.prepares_on_one_core:
        return True
    early = compare_final_outputs(torch_outputs, candidate.run_outputs(arrays),
                                  judge=settings.judge, warnings=[])
    return any(record.failed for record in early)


def _run_sample(settings: Settings, arrays: list[np.ndarray], description: str):
    """One sample through every stage: its report, and how to write its repro.

    One step: each stage returns its findings, and the report is assembled from them.
    """
    candidate = settings.prepared.candidate
    check_against_onnx(arrays, candidate.inputs)
    # Known from shapes alone, before either side holds a value.
    memory_reason = over_budget(candidate, arrays, settings.budget)
    torch_capture = _torch_capture(settings, arrays)
    # PyTorch's values are recorded: one copy of the weights (the file's, where it holds them)
    settings.parking.park(candidate.model, candidate.path.parent)
    emit(CAPTURE_STARTED, display_name(candidate.runtime))
    # The translations (for inside_op), imported while the capture is made.
    with (imported_meanwhile(candidate.model, wanted=_imports_meanwhile(
              settings, arrays, torch_capture.outputs, memory_reason)),
          kept_in_heap(settings.parking.parked)):  # its pages kept for the weights read back
        run = run_candidate(candidate, arrays, memory_reason=memory_reason)
    warnings = list(settings.reference.warnings)
    # The verdict is production's, whatever the capture session computed.
    final_outputs = compare_final_outputs(torch_capture.outputs, run.production,
                                          judge=settings.judge, warnings=warnings)
    diverged = any(record.failed for record in final_outputs)
    ops = op_values(settings, arrays, diverged=diverged, memory_reason=memory_reason)
    bisection = None
    if memory_reason and diverged:
        bisection = bisect_production(run.runner, candidate, references_by_value([], ops),
                                      rtol=settings.rtol, atol=settings.atol,
                                      memory_budget=settings.budget)
        if bisection is None:
            warnings.append(MEMORY_NO_OPS)
    onnx_capture = bisection.capture if bisection is not None else run.capture
    findings, pairs, segments = _compare(settings, torch_capture, onnx_capture, arrays, ops,
                                         final_outputs, list(warnings))
    float64 = module_float64(settings.reference, arrays, settings.prepared.keywords,
                             graph_inputs(candidate, arrays), pairs)
    attribute = partial(attribute_sample, settings, arrays=arrays, torch_capture=torch_capture,
                        onnx_capture=onnx_capture)
    attributed = None  # a module-level attribution that is the report, as it is
    report = assemble(findings)
    if ops is None and not memory_reason and (diverged or report.hidden_divergences):
        # A hidden divergence has a culprit too: op precision, as for a divergence.
        ops, attributed = later_op_values(
            settings, arrays, report, (torch_capture, onnx_capture), pairs, run,
            attribute=partial(attribute, pairs=pairs, bisection=None, ops=None,
                              segments=segments, float64=float64))
        if attributed is not None:
            findings = attributed[0]
        if ops is not None:
            findings, pairs, segments = _compare(settings, torch_capture, onnx_capture, arrays,
                                                 ops, final_outputs, list(warnings))
    findings, bisection = _search_production(settings, findings, run, arrays, bisection,
                                             memory_reason, references_by_value(pairs, ops))
    findings = replace(findings, warnings=tuple(subgraph_warnings(candidate.model)))
    if attributed is not None and bisection is None:
        values = attributed[1]
    else:
        findings, values = attribute(findings, pairs=pairs, bisection=bisection, ops=ops,
                                     segments=segments, float64=float64)
    report = assemble(findings)
    report = assemble(replace(findings, description=describe_run(
        report, settings.prepared, settings.export, settings.reference.side, run,
        description, torch_capture, onnx_capture, tolerance=settings.judge.base)))
    if settings.fixes.suggest:
        report = sample_fixes(report, settings, arrays, torch_capture.outputs, run.production)
    return report, partial(write_torch_repro, report=report, candidate=candidate,
                           reference_values=values.reference,
                           candidate_values=values.candidate, torch_capture=torch_capture,
                           onnx_capture=onnx_capture,
                           graph_inputs=graph_inputs(candidate, arrays),
                           tolerance=settings.judge)


def _search_production(settings: Settings, findings: Findings, run: Any,
                       arrays: Sequence[np.ndarray], bisection: ProbeBisection | None,
                       memory_reason: str | None,
                       references: Any) -> tuple[Findings, ProbeBisection | None]:
    """Say how production was searched; probe it where the capture may not show it."""
    report = assemble(findings)
    if bisection is not None:
        search = memory_bisection(report, bisection, memory_reason)
    elif memory_reason:
        search = nothing_fetched(report, memory_reason)
    elif wants_probes(report, run, settings.judge.base):
        probed = probe_production(report, run, arrays,
                                  checkpoints_for(settings.prepared.candidate, references),
                                  tolerance=settings.judge.base,
                                  compare=settings.judge.probe_comparer())
        if probed is None:
            return findings, None
        bisection, search = probed
    else:
        return findings, None
    return replace(findings, search=search), bisection


def _torch_capture(settings: Settings, arrays: Sequence[np.ndarray]) -> Capture:
    """PyTorch's values: the export's run on these inputs, or a run now."""
    prepared = settings.prepared
    if prepared.capture is not None and prepared.ran_on(arrays):
        return prepared.capture
    settings.parking.restore()  # an earlier sample's ONNX Runtime side is gone
    emit(CAPTURE_STARTED, "pytorch")
    return settings.reference.side.run(arrays, keywords=settings.prepared.keywords)


def _compare(settings: Settings, torch_capture: Capture, onnx_capture: Capture,
             arrays: Sequence[np.ndarray], ops: OpCapture | None, final_outputs: list,
             warnings: list[str]) -> tuple[Findings, list[Any], dict[str, Any]]:
    """Align op and module values, compare them, decide: the sample's first findings."""
    prepared, candidate = settings.prepared, settings.prepared.candidate
    op_alignment = None
    if ops is not None:
        op_alignment = align_op_values(
            ops, *alignment_inputs(ops, candidate.nodes, onnx_capture.values),
            template=prepared.template,
            foreign=candidate.model, foreign_dir=candidate.path.resolve().parent,
            graph_inputs=graph_inputs(candidate, arrays), rtol=settings.rtol,
            atol=settings.atol)
    if settings.granularity == Granularity.OP and ops is None:
        warnings.append(NO_OP_LEVEL)
    if prepared.template is not None:
        warnings.append(FOREIGN_FILE)
    comparison, pairs, segments = compare_sample(
        torch_capture, onnx_capture, candidate, prepared.call_index, op_alignment,
        len(ops.values) if ops else 0, final_outputs, judge=settings.judge, warnings=warnings,
        granularity=Granularity.OP if ops is not None and settings.granularity != Granularity.MODULE
        else Granularity.MODULE, op_scope=op_scope(ops, onnx_capture.values))
    return Findings(comparison), pairs, segments
