"""PyTorch against ONNX: the public ``bisect``, one sample at a time through the stages.

Data flows one way: prepare the ONNX model (export or given file), then per sample
capture both sides, compare, search production where the capture cannot show the
first divergence, attribute it, and describe the run. Each step lives in its own
module; this one wires them.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.op_level import GRANULARITIES, align_op_values, look_inside_first_divergence
from bisect_onnx.align.script_inside import references_by_onnx_value
from bisect_onnx.errors import UsageError
from bisect_onnx.events import BISECTION_STARTED, CAPTURE_STARTED, emit
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.judge.records import Report
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.tolerances import tolerance_rules
from bisect_onnx.judge.vocabulary import Granularity
from bisect_onnx.pipeline.call_ops import alignment_inputs, op_scope, traces_one_call
from bisect_onnx.pipeline.description import describe_run
from bisect_onnx.pipeline.inside_op import look_inside_module_culprit, name_the_ops
from bisect_onnx.pipeline.module_float64 import ModuleFloat64, module_float64
from bisect_onnx.pipeline.op_sources import later_op_values, op_values
from bisect_onnx.pipeline.options import ExportOptions, RandomInputs, RuntimeOptions
from bisect_onnx.pipeline.prepare import (
    PreparedCandidate,
    arrange_for,
    prepare_candidate,
    resolve_export,
)
from bisect_onnx.pipeline.production import (
    not_probed,
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
from bisect_onnx.pipeline.torch_comparison import (
    FOREIGN_FILE,
    NO_OP_LEVEL,
    compare_final_outputs,
    compare_sample,
    subgraph_warnings,
)
from bisect_onnx.pytorch.exporter_imports import imported_meanwhile
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.pytorch.parking import WeightParking, parking_for
from bisect_onnx.pytorch.reference import Reference, exit_is_a_model_error, reference_for
from bisect_onnx.pytorch.script_ops import ScriptOpCapture
from bisect_onnx.runtime.heap import kept_in_heap
from bisect_onnx.runtime.sides import Capture
from bisect_onnx.search.blame import attribute_divergence
from bisect_onnx.search.modes import (
    MEMORY_NO_OPS,
    bisect_production,
    over_budget,
    references_by_value,
)
from bisect_onnx.search.probes import ProbeBisection, checkpoints_for
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.input_sizes import Budget, check_sample_count, input_budget
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
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    export: ExportOptions | None = None,
    random_inputs: RandomInputs | None = None,
    trust_pickle: bool = False,
    repro_dir: str | Path | None = None,
    model_label: str | None = None,
    granularity: str | None = None,
    all_culprits: bool = False,
    runtime: RuntimeOptions | None = None,
    tolerances: str | Path | Mapping[str, tuple[float, float]] | None = None,
) -> Report:
    """Compare a PyTorch model with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: An ``nn.Module`` (its train/eval mode is used as given), an
            ``ExportedProgram``, a ``torch.onnx.ONNXProgram`` (its own ONNX model is
            the one tested), a TorchScript module, or a path to a saved one.
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays;
            :class:`~bisect_onnx.Samples` of several such sets to try each (the report
            is the worst one's). ``None`` draws random inputs from the ONNX graph (see
            ``random_inputs``).
        onnx_model: An existing export to compare against: a path, an
            ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``. Without it the
            model is exported here (see ``export``).
        rtol: Relative tolerance; an element fails when
            ``|onnx - torch| > atol + rtol * |torch|``.
        atol: Absolute tolerance.
        export: How to export when no ONNX model is given.
        random_inputs: Seed, free dimensions and sample count for drawn inputs.
        trust_pickle: Allow ``model`` to be a path to a whole pickled module, which
            runs any code the file names when loaded.
        repro_dir: On divergence, write there a standalone repro of the first
            divergence (``<dir>/sample-<k>`` for each diverging random sample).
        model_label: How the model is named in the report.
        granularity: ``op`` (a row per ATen op: the dynamo exporter's ExportedProgram
            names the ONNX values; a TorchScript file's are paired with a trace of the
            model by module scope, op and order) or ``module`` (a row per module
            call). ``None``: op where the program is at hand (an export made here,
            an ONNXProgram, a .pt2); for a file exported elsewhere the model is traced
            again for it only when the outputs diverge or an intermediate does (it
            takes seconds).
        runtime: Provider, optimization level and promotion for ONNX Runtime.
        all_culprits: Check every failing value on PyTorch's inputs and list each one
            that introduces error (``report.culprits``), not only the first.
        tolerances: Per-value tolerances: a file of ``PATTERN RTOL ATOL`` lines, or a
            mapping ``{pattern: (rtol, atol)}``; the first pattern matching a value's ONNX
            name, op (FX node) or module call wins, the others get ``rtol``/``atol``.

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    judge = ToleranceJudge.from_floats(rtol, atol, tolerance_rules(tolerances))
    runtime = runtime or RuntimeOptions()
    runtime.check()  # before any export
    if granularity is not None and granularity not in GRANULARITIES:
        raise UsageError(f"unknown granularity {granularity!r}; choose one of "
                         f"{', '.join(GRANULARITIES)}")
    check_sample_count((random_inputs or RandomInputs()).samples)
    check_run_files({"repro_dir": repro_dir, "export.save_to": export and export.save_to},
                    model=model, onnx_models={"onnx_model": onnx_model},
                    folders={"repro_dir"}, makes_parents={"export.save_to"})
    emit(BISECTION_STARTED, model_label or "")
    reference = reference_for(model, label=model_label, trust_pickle=trust_pickle)
    export = resolve_export(reference, onnx_model, export)
    random_inputs = random_inputs or RandomInputs()
    random_inputs.check_unused(inputs)
    given = given_input_sets(inputs)
    with (tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir,
          parking_for(reference.exportable, Path(workdir)) as parking):
        # The export is made on the first input set (and PyTorch's run on it kept).
        prepared = prepare_candidate(reference, given[0][0] if given else None, onnx_model,
                                     export, Path(workdir), runtime)
        settings = Settings(reference, prepared, export, Path(workdir), judge=judge,
                            granularity=granularity, all_culprits=all_culprits,
                            budget=runtime.budget(),  # what is left once the model is loaded
                            input_budget=input_budget(runtime.max_memory), parking=parking)
        return run_prepared(settings, given, random_inputs, repro_dir=repro_dir,
                            kind=samples_kind(inputs))


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


def _run_sample(settings: Settings, arrays: list[np.ndarray], description: str):
    """One sample through every stage: its report, and how to write its repro."""
    candidate = settings.prepared.candidate
    check_against_onnx(arrays, candidate.inputs)
    # Known from shapes alone, before either side holds a value.
    memory_reason = over_budget(candidate, arrays, settings.budget)
    torch_capture = _torch_capture(settings, arrays)
    # PyTorch's values are recorded: one copy of the weights (the file's, where it holds them)
    settings.parking.park(candidate.model, candidate.path.parent)
    emit(CAPTURE_STARTED, "onnxruntime")
    with (imported_meanwhile(candidate.model,  # the translations, for inside_op
                             wanted=traces_one_call(settings) and not memory_reason),
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
    report, pairs, segments = _compare(settings, torch_capture, onnx_capture, arrays, ops,
                                       final_outputs, list(warnings))
    float64 = module_float64(settings.reference, arrays, settings.prepared.keywords,
                             _graph_inputs(candidate, arrays), pairs)
    attributed = None  # a module-level attribution that is the report, as it is
    if ops is None and not memory_reason and (diverged or report.hidden_divergences):
        # A hidden divergence has a culprit too: op precision, as for a divergence.
        ops, attributed = later_op_values(
            settings, arrays, report, (torch_capture, onnx_capture), pairs, run,
            attribute=partial(_attribute, settings, arrays=arrays, torch_capture=torch_capture,
                              onnx_capture=onnx_capture, pairs=pairs, bisection=None,
                              ops=None, segments=segments, float64=float64))
        if attributed is not None:
            report = attributed[0]
        if ops is not None:
            report, pairs, segments = _compare(settings, torch_capture, onnx_capture, arrays,
                                               ops, final_outputs, list(warnings))
    bisection = _search_production(settings, report, run, arrays, bisection, memory_reason,
                                   references_by_value(pairs, ops))
    report.warnings.extend(subgraph_warnings(candidate.model))
    values = attributed[1] if attributed is not None and bisection is None else _attribute(
        settings, report, arrays, torch_capture, onnx_capture, pairs, bisection, ops, segments,
        float64)
    describe_run(report, settings.prepared, settings.export, settings.reference.side, run,
                 description, torch_capture, onnx_capture)
    return report, partial(write_torch_repro, report=report, candidate=candidate,
                           reference_values=values.reference,
                           candidate_values=values.candidate, torch_capture=torch_capture,
                           onnx_capture=onnx_capture,
                           graph_inputs=_graph_inputs(candidate, arrays))


def _search_production(settings: Settings, report: Report, run: Any, arrays: Sequence[np.ndarray],
                       bisection: ProbeBisection | None, memory_reason: str | None,
                       references: Any) -> ProbeBisection | None:
    """Say how production was searched; probe it where the capture may not show it."""
    if bisection is not None:
        report.search = bisection.describe(memory_reason)
        report.warnings.extend(bisection.warnings())
        not_probed(report)
    elif memory_reason:
        nothing_fetched(report, memory_reason)
    elif wants_probes(report, run):
        bisection = probe_production(report, run, arrays,
                                     checkpoints_for(settings.prepared.candidate, references),
                                     compare=settings.judge.probe_comparer())
    return bisection


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
             warnings: list[str]):
    """Align op and module values, compare them, decide: the sample's first report."""
    prepared, candidate = settings.prepared, settings.prepared.candidate
    op_alignment = None
    if ops is not None:
        op_alignment = align_op_values(
            ops, *alignment_inputs(ops, candidate.nodes, onnx_capture.values),
            template=prepared.template,
            foreign=candidate.model, foreign_dir=candidate.path.resolve().parent,
            graph_inputs=_graph_inputs(candidate, arrays), rtol=settings.rtol,
            atol=settings.atol)
    if settings.granularity == Granularity.OP and ops is None:
        warnings.append(NO_OP_LEVEL)
    report, pairs, segments = compare_sample(
        torch_capture, onnx_capture, candidate, prepared.call_index, op_alignment,
        len(ops.values) if ops else 0, final_outputs, judge=settings.judge, warnings=warnings,
        granularity=Granularity.OP if ops is not None and settings.granularity != Granularity.MODULE
        else Granularity.MODULE, op_scope=op_scope(ops, onnx_capture.values))
    if prepared.template is not None:
        report.warnings.append(FOREIGN_FILE)
    return report, pairs, segments


@dataclass
class _SampleValues:
    """One sample's arrays by ONNX value name, for attribution and the repro."""

    reference: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]


def _attribute(settings: Settings, report: Report, arrays: Sequence[np.ndarray],
               torch_capture: Capture, onnx_capture: Capture, pairs: Sequence,
               bisection: ProbeBisection | None, ops: OpCapture | None,
               segments: Any, float64: ModuleFloat64 | None) -> _SampleValues:
    """Check failing values on PyTorch's inputs: which node introduced the error.

    ``float64`` reruns a module-level culprit's segment in PyTorch, where no program
    gives its float64 value.
    """
    prepared, candidate = settings.prepared, settings.prepared.candidate
    program = getattr(ops, "program", None) or prepared.program  # one call's, or the model's
    values = _SampleValues(
        reference={pair.candidate.name: pair.reference.array for pair in pairs},
        candidate={name: value.array for name, value in onnx_capture.values.items()})
    if bisection is not None:  # values only the probes fetched
        values.reference.update(bisection.references)
        values.candidate.update({name: value.array for name, value
                                 in bisection.capture.values.items()})
    if not (report.diverged or report.hidden_divergences):  # hidden ones have culprits too
        return values
    script = isinstance(ops, ScriptOpCapture)  # op names are not ONNX value names there
    module_level = float64 is not None and ops is None  # PyTorch's side is its module calls
    local_values = attribute_divergence(
        report, candidate, values.reference, values.candidate,
        _graph_inputs(candidate, arrays), program=program,
        ops=None if script else ops, modules=(torch_capture, prepared.call_index),
        everything=settings.all_culprits,
        kernel_references=references_by_onnx_value(segments, ops) if script else None,
        compare=settings.judge.local_comparer(report, values.reference),
        torch_float64=float64 if module_level else None)
    if module_level:  # no op values: look inside the culprit's op without them
        look_inside_module_culprit(report, candidate, settings.reference.exportable,
                                   {**values.reference, **_graph_inputs(candidate, arrays)},
                                   {**values.candidate, **local_values})
        name_the_ops(report, candidate)
    elif (report.coverage.granularity == Granularity.OP and report.first_divergence is not None
            and prepared.template is None):
        # The culprit's own nodes on exact inputs hold the values a fused capture
        # leaves out; the captured ones serve otherwise.
        look_inside_first_divergence(
            report, segments, ops, program, candidate.model,
            {**values.candidate, **local_values}, opset=candidate.opset)
    return values


def _graph_inputs(candidate: Any, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return {spec.name: array for spec, array in zip(candidate.inputs, arrays, strict=True)}
