"""The driver: load, export, capture both sides, align, compare, decide.

Data flows one way; each step lives in its own module and this one only wires
them together and owns the temporary folder.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.modules import Alignment, Pair, align_modules
from bisect_onnx.align.op_level import (
    GRANULARITIES,
    aggregate_ops,
    align_op_values,
    look_inside_first_divergence,
    op_records,
)
from bisect_onnx.align.ops import OpAlignment
from bisect_onnx.errors import BisectOnnxError, InputError, UsageError
from bisect_onnx.events import BISECTION_STARTED, CAPTURE_STARTED, emit
from bisect_onnx.graph.scopes import count_attributed, detect_exporter
from bisect_onnx.graph.weights import copy_model, external_location
from bisect_onnx.judge.compare import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    check_tolerances,
    compare_arrays,
)
from bisect_onnx.judge.records import Coverage, Record, Report, make_record
from bisect_onnx.judge.verdict import decide
from bisect_onnx.pytorch.exporting import (
    EXPORTERS,
    as_translated,
    call_index_from_program,
    export_model,
    trace_program,
)
from bisect_onnx.pytorch.op_values import capture_ops
from bisect_onnx.pytorch.reference import (
    EXPORTED_PROGRAM,
    MODULE,
    SCRIPT_MODULE,
    Reference,
    reference_for,
)
from bisect_onnx.report.context import culprit_context
from bisect_onnx.report.repro import attach_repro, write_repro
from bisect_onnx.runtime.memory import default_budget, parse_size
from bisect_onnx.runtime.onnx_side import (
    CPU_PROVIDER,
    DEFAULT_OPT_LEVEL,
    NodeInfo,
    OnnxRuntimeSide,
    graph_tensors,
    subgraphs,
)
from bisect_onnx.runtime.sessions import check_runtime
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search import modes as search_modes
from bisect_onnx.search.blame import attribute_divergence
from bisect_onnx.search.modes import (
    MEMORY_NO_OPS,
    adopt_bisection,
    bisect_production,
    no_value_fails,
    outputs_differ,
    over_budget,
    production_outputs,
    references_by_value,
)
from bisect_onnx.search.probes import ProbeBisection, ProbeRunner
from bisect_onnx.sources.loading import (
    arrange_inputs,
    check_against_onnx,
    check_input_count,
    keyword_order,
)
from bisect_onnx.sources.random_inputs import synthesize_inputs, vocabulary_limits
from bisect_onnx.version import __version__

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["bisect", "ExportOptions", "RandomInputs", "RuntimeOptions"]
# Also used by bisect_onnx.pipeline.parity: prepare_candidate, arrange_for, as_arrays,
# compare_final_outputs, resolve_export.

logger = logging.getLogger(__name__)

CAPTURE_DIFFERS_WARNING = (
    "the capture session ({mode}) computes final outputs that differ from the production "
    "session's by up to {difference} (other kernels, other rounding): a divergence only "
    "the production kernels show may be missed"
)
FOREIGN_FILE = (
    "the ONNX file carries no exporter metadata (renamed by another tool, or built "
    "elsewhere): its values were matched by structure to an export made here, each match "
    "with a confidence (matched_by, match_confidence); check the match of the first "
    "divergence"
)
NOTHING_ALIGNED = ("no intermediate value could be aligned: only the final outputs were "
                   "compared, which says nothing about where a divergence starts")
MEMORY_PARITY = ("over the memory budget, only production's final outputs were computed; "
                 "they agree, and values are probed only to locate a divergence (hidden "
                 "divergences under agreeing outputs were not looked for)")
NO_OP_LEVEL = (
    "op granularity needs the ExportedProgram the dynamo exporter translated (an export "
    "made here, an ONNXProgram, or a .pt2 exported here); compared at module level"
)


@dataclass(frozen=True)
class ExportOptions:
    """How bisect-onnx exports the model when no ONNX model is given."""

    exporter: str | None = None
    """``dynamo`` (torch's default) or ``torchscript`` (``dynamo=False``); ``None``
    picks dynamo, or torchscript for a TorchScript model, which dynamo cannot take."""
    opset: int | None = None
    dynamic_batch: bool = False
    """Export dimension 0 of every input as dynamic."""
    save_to: str | Path | None = None
    """Keep a copy of the export there."""
    torch_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """More keywords for ``torch.onnx.export`` (``custom_translation_table``, ...)."""


@dataclass(frozen=True)
class RuntimeOptions:
    """How ONNX Runtime runs the ONNX model under test."""

    provider: str = CPU_PROVIDER
    opt_level: str = DEFAULT_OPT_LEVEL
    """``disabled``, ``basic``, ``extended`` or ``all`` (ONNX Runtime's default)."""
    promote: str = "fused"
    """``fused``: promote only the values that survive ORT's optimizations, so the
    capture runs the production kernels (checked); ``all``: every node output."""
    max_memory: int | str | None = None
    """Memory the captured values of both sides may take (bytes, or ``"2GB"``); over
    it, values are probed a few at a time. ``None``: most of the memory available."""


@dataclass(frozen=True)
class RandomInputs:
    """Inputs drawn from the ONNX graph's input specification, when none are given."""

    seed: int = 0
    dims: Mapping[str, int] = field(default_factory=dict)
    """Values of the graph's named free dimensions (``{"sequence": 128}``)."""
    samples: int = 1
    """How many inputs to try; the report is the worst one's."""


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
) -> Report:
    """Compare a PyTorch model with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: An ``nn.Module`` (its train/eval mode is used as given), an
            ``ExportedProgram``, a ``torch.onnx.ONNXProgram`` (its own ONNX model is
            the one tested), a TorchScript module, or a path to a saved one.
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays.
            ``None`` draws random inputs from the ONNX graph (see ``random_inputs``).
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
        granularity: ``op`` (a row per ATen op, where the dynamo exporter's
            ExportedProgram names the ONNX values) or ``module`` (a row per module
            call). ``None``: op where the program is at hand (an export made here,
            an ONNXProgram, a .pt2); for a dynamo file exported elsewhere the model is
            traced again for it only when the outputs diverge (it takes seconds).
        runtime: Provider, optimization level and promotion for ONNX Runtime.
        all_culprits: Check every failing value on PyTorch's inputs and list each one
            that introduces error (``report.culprits``), not only the first.

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    check_tolerances(rtol, atol)
    runtime = runtime or RuntimeOptions()
    check_runtime(runtime.provider, runtime.opt_level, runtime.promote)  # before any export
    budget = parse_size(runtime.max_memory) if runtime.max_memory is not None else None
    if granularity is not None and granularity not in GRANULARITIES:
        raise UsageError(f"unknown granularity {granularity!r}; choose one of "
                         f"{', '.join(GRANULARITIES)}")
    emit(BISECTION_STARTED, model_label or "")
    reference = reference_for(model, label=model_label, trust_pickle=trust_pickle)
    export = resolve_export(reference, onnx_model, export)
    _check_random_inputs(inputs, random_inputs)
    random_inputs = random_inputs or RandomInputs()
    given = as_arrays(inputs) if inputs is not None else None
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir:
        prepared = prepare_candidate(reference, given, onnx_model, export, Path(workdir),
                                     runtime)
        candidate, keywords = prepared.candidate, prepared.keywords
        if runtime.max_memory is None:  # what is left once the model is loaded
            budget = default_budget()
        source, exporter = prepared.source, prepared.exporter
        if given is not None:
            samples = [(arrange_for(reference, candidate, given), "given")]
        else:
            samples = _random_samples(candidate, random_inputs)
        reports = []
        for number, (arrays, description) in enumerate(samples, start=1):
            check_against_onnx(arrays, candidate.inputs)
            # Known from shapes alone, before either side holds a value.
            memory_reason = over_budget(candidate, arrays, budget)
            if prepared.capture is None:
                emit(CAPTURE_STARTED, "pytorch")
            torch_capture = prepared.capture or reference.side.run(arrays, keywords=keywords)
            emit(CAPTURE_STARTED, "onnxruntime")
            onnx_run = _run_candidate(candidate, arrays, memory_reason)
            onnx_capture = onnx_run.capture
            graph_inputs = {spec.name: array
                            for spec, array in zip(candidate.inputs, arrays, strict=True)}
            warnings = list(reference.warnings)
            # The verdict is production's, whatever the capture session computed.
            final_outputs = compare_final_outputs(
                torch_capture.outputs, onnx_run.production, rtol=rtol, atol=atol,
                warnings=warnings)
            ops = op_alignment = None
            # Tracing the model again (for a file exported elsewhere) takes seconds: by
            # default only when the outputs diverge, where op precision pays for it.
            diverged = any(record.failed for record in final_outputs)
            # Over the budget, values are probed by their op names only on a divergence.
            if prepared.wants_program and (granularity == "op" or diverged and (
                    granularity is None or memory_reason)):
                prepared.find_program(reference, arrays, Path(workdir))
            # Over the budget at parity nothing is probed, so no op values are needed.
            if prepared.program is not None and (diverged or not memory_reason):
                emit(CAPTURE_STARTED, "pytorch ops")
                ops = capture_ops(prepared.program, arrays)
            bisection = None
            if memory_reason and diverged:
                bisection = bisect_production(
                    onnx_run.runner, candidate, references_by_value([], ops), rtol=rtol,
                    atol=atol)
                if bisection is None:
                    warnings.append(MEMORY_NO_OPS)
                else:
                    onnx_capture = bisection.capture
            if ops is not None:
                op_alignment = align_op_values(
                    ops, candidate.nodes, onnx_capture.values, template=prepared.template,
                    foreign=candidate.model, foreign_dir=candidate.path.resolve().parent,
                    graph_inputs=graph_inputs, rtol=rtol, atol=atol)
            if granularity == "op" and ops is None:
                warnings.append(NO_OP_LEVEL)
            report, pairs, segments = _compare(
                torch_capture, onnx_capture, candidate, prepared.call_index, op_alignment,
                len(ops.values) if ops else 0, final_outputs, rtol=rtol, atol=atol,
                warnings=warnings,
                granularity="op" if ops is not None and granularity != "module" else "module")
            if prepared.template is not None:
                report.warnings.append(FOREIGN_FILE)
            if bisection is not None:
                report.search = bisection.describe(memory_reason)
                report.warnings.extend(bisection.warnings())
            elif memory_reason:  # nothing was fetched to align: not an alignment failure
                report.search = {"mode": "final outputs only", "reason": memory_reason}
                report.warnings = [warning for warning in report.warnings
                                   if warning != NOTHING_ALIGNED]
                report.unaligned, report.onnx_unaligned = [], []  # nothing was fetched
                if not report.diverged:
                    report.warnings.append(MEMORY_PARITY)
            elif report.diverged and (onnx_run.capture_differs or no_value_fails(report)):
                bisection = _probe_production(report, onnx_run, candidate, arrays,
                                              references_by_value(pairs, ops))
            report.warnings.extend(_subgraph_warnings(candidate.model))
            local_values = {}
            candidate_arrays = {name: value.array for name, value in onnx_capture.values.items()}
            reference_arrays = {pair.candidate.name: pair.reference.array for pair in pairs}
            if bisection is not None:  # values only the probes fetched
                reference_arrays.update(bisection.references)
                candidate_arrays.update({name: value.array for name, value
                                         in bisection.capture.values.items()})
            if report.diverged or report.hidden_divergences:  # hidden ones have culprits too
                local_values = attribute_divergence(
                    report, candidate, reference_arrays,
                    candidate_arrays, graph_inputs, program=prepared.program, ops=ops,
                    modules=(torch_capture, prepared.call_index),
                    everything=all_culprits)
            if (report.coverage.granularity == "op" and report.first_divergence is not None
                    and prepared.template is None):
                # The culprit's own nodes on exact inputs hold the values a fused capture
                # leaves out; the captured ones serve otherwise.
                look_inside_first_divergence(
                    report, segments, ops, prepared.program, candidate.model,
                    {**candidate_arrays, **local_values}, opset=candidate.opset)
            report.reference = {**reference.side.describe(), "inputs": description}
            report.candidate = {**candidate.describe(), "model": source}
            report.environment = _environment(candidate, exporter)
            report.capture = candidate.describe_capture()
            if candidate.outputs_match_production is False:
                report.warnings.append(CAPTURE_DIFFERS_WARNING.format(
                    difference=candidate.production_difference,
                    mode=report.capture.get("mode")))
            report.culprit = culprit_context(report.first_culprit or report.first_divergence,
                                             candidate,
                                             torch_capture, onnx_capture, report.comparisons)
            _check_opset(report, export, candidate)
            attach_repro(report, repro_dir, sample=None if given is not None else number,
                         write=partial(_write_repro, report=report, candidate=candidate,
                                       reference_arrays=reference_arrays,
                                       candidate_arrays=candidate_arrays,
                                       torch_capture=torch_capture,
                                       onnx_capture=onnx_capture, arrays=arrays))
            reports.append(report)
        return worst_report(reports)


@dataclass
class _CandidateRun:
    """ONNX Runtime's side of one sample: the capture, and production's final outputs."""

    capture: Capture
    production: list[CapturedValue]
    """The production session's final outputs: the verdict is theirs."""
    runner: ProbeRunner | None = None
    """Probes of production, where one was needed already."""
    capture_differs: bool = False
    """The capture session's final outputs are not bitwise production's."""


def _run_candidate(candidate: OnnxRuntimeSide, arrays: Sequence[np.ndarray],
                   memory_reason: str | None) -> _CandidateRun:
    """Capture ONNX Runtime's values, or only production's outputs when over budget."""
    if memory_reason:  # production's outputs now, its values by probes later
        runner = ProbeRunner(candidate, arrays)
        return _CandidateRun(Capture(values={}, outputs=runner.outputs), runner.outputs,
                             runner)
    logger.info("running ONNX Runtime with its values promoted")
    capture = candidate.run(arrays)
    production, runner = production_outputs(candidate, capture, arrays)
    return _CandidateRun(capture, production, runner,
                         capture_differs=outputs_differ(capture.outputs, production))


def _probe_production(report: Report, onnx_run: _CandidateRun, candidate: OnnxRuntimeSide,
                      arrays: Sequence[np.ndarray],
                      references: Mapping[str, CapturedValue]) -> ProbeBisection | None:
    """Bisect production when the capture may not show what it computes.

    The probes' first failing value becomes the report's first divergence.
    """
    runner = onnx_run.runner or ProbeRunner(candidate, arrays)
    bisection = bisect_production(runner, candidate, references, rtol=report.rtol,
                                  atol=report.atol)
    if bisection is not None:
        adopt_bisection(report, bisection, search_modes.CAPTURE_DIFFERS
                        if onnx_run.capture_differs else search_modes.NO_VALUE_FAILS,
                        references, {output: node.index for node in candidate.nodes
                                     for output in node.outputs})
    return bisection


def _subgraph_warnings(model: Any) -> list[str]:
    """Say that values inside If/Loop/Scan bodies were not compared, only their outputs."""
    holders = [node.name or node.op_type for node in model.graph.node
               if any(next(subgraphs(attribute), None) is not None
                      for attribute in node.attribute)]
    if not holders:
        return []
    return [f"values inside the subgraphs of {len(holders)} node(s) ({', '.join(holders[:5])}"
            f"{', …' if len(holders) > 5 else ''}) are not promotable and were not compared: "
            "those nodes are compared at the subgraph boundary, by their outputs"]


@dataclass
class PreparedCandidate:
    """The ONNX model under test, ready to run, and what is already known about it."""

    candidate: OnnxRuntimeSide
    source: str
    """``exported here``, or what the user passed."""
    exporter: str
    call_index: dict[str, dict[str, int]]
    keywords: list[str]
    capture: Capture | None = None
    """The reference's capture on the given inputs, when the export already ran it."""
    program: Any = None
    """The ExportedProgram whose FX node names are the ONNX value names (op level)."""

    _looked: bool = field(default=False, init=False, repr=False)
    """Whether a program was already looked for (once per run, whatever it found)."""
    template: Any = None
    """For an ONNX file of unknown origin: an export made here (an ``onnx.ModelProto``)
    whose values are named after ``program``'s ops, matched to the file by structure."""

    @property
    def wants_program(self) -> bool:
        """A dynamo or unknown file given without a program: one may be made here."""
        return (self.program is None and self.exporter in ("dynamo", "unknown")
                and not self._looked)

    def find_program(self, reference: Reference, arrays: Sequence[np.ndarray],
                     folder: Path) -> None:
        """Trace the model as the exporter did; for a file of unknown origin, export it.

        A dynamo file's values are named after the traced program's ops when it is the
        same model; any other file is matched to an export made here by structure.
        """
        self._looked = True
        if self.exporter == "dynamo" and reference.kind == MODULE:
            logger.info("tracing the model with torch.export for op-level alignment")
            program = trace_program(reference.exportable, arrays, self.keywords)
            if names_the_values(program, self.candidate.nodes):
                self.program = program
                self.call_index = call_index_from_program(program)
        elif self.exporter == "unknown" and reference.kind in (MODULE, EXPORTED_PROGRAM):
            self._export_template(reference, arrays, folder / "template")

    def _export_template(self, reference: Reference, arrays: Sequence[np.ndarray],
                         folder: Path) -> None:
        import onnx

        logger.info("exporting the model here to match a file of unknown origin")
        folder.mkdir()
        try:
            exported = export_model(reference.exportable, arrays, folder, exporter="dynamo",
                                    opset=self.candidate.opset, keywords=self.keywords)
        except BisectOnnxError as error:  # the user's file is still compared at the end
            logger.info("no template export: %s", error)
            return
        if exported.program is not None:
            self.program = exported.program
            self.template = onnx.load(str(exported.path))



def prepare_candidate(reference: Reference, given: Any, onnx_model: Any,
                      export: ExportOptions, folder: Path,
                      runtime: RuntimeOptions | None = None) -> PreparedCandidate:
    """The user's ONNX model (a path, a proto, an ONNXProgram's own), or an export made here."""
    keywords = _keywords(reference, given)
    if onnx_model is not None or reference.onnx_program is not None:
        candidate, source, program = _given_candidate(reference, onnx_model, folder,
                                                      runtime or RuntimeOptions())
        exporter = detect_exporter(candidate.nodes)
        return PreparedCandidate(candidate, source, exporter, call_index_from_program(program),
                                 keywords, program=program if exporter == "dynamo" else None)
    candidate, capture, exported = _export_candidate(reference, given, export, folder,
                                                     runtime or RuntimeOptions())
    return PreparedCandidate(candidate, "exported here", export.exporter or "dynamo",
                             exported.call_index, keywords,
                             capture if given is not None else None, exported.program)


def _check_random_inputs(inputs: Any, random_inputs: RandomInputs | None) -> None:
    if random_inputs is None:
        return
    if not isinstance(random_inputs.samples, int) or random_inputs.samples < 1:
        raise UsageError(f"samples must be a whole number >= 1, got {random_inputs.samples!r}")
    if inputs is not None and random_inputs != RandomInputs():
        raise UsageError("seed, dims and samples apply to random inputs: drop them, or drop "
                         "the given inputs")


def resolve_export(reference: Reference, onnx_model: Any,
                   export: ExportOptions | None) -> ExportOptions:
    """Check the export options against the model form; fill in the exporter."""
    if export is not None and (onnx_model is not None or reference.onnx_program is not None):
        raise UsageError("export options apply to an export made here; drop them when "
                         "comparing an existing ONNX model")
    if onnx_model is not None and reference.onnx_program is not None:
        raise UsageError("an ONNXProgram brings its own ONNX model; pass onnx_model only "
                         "with an nn.Module or ExportedProgram")
    export = export or ExportOptions()
    exporter = export.exporter
    if exporter is None:
        exporter = "torchscript" if reference.kind == SCRIPT_MODULE else "dynamo"
    if exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if exporter == "dynamo" and reference.kind == SCRIPT_MODULE:
        raise UsageError("the dynamo exporter cannot take a TorchScript model; use the "
                         "torchscript exporter (--exporter torchscript)")
    if exporter == "torchscript" and reference.kind == EXPORTED_PROGRAM:
        raise UsageError("the TorchScript exporter cannot take an ExportedProgram; use the "
                         "dynamo exporter (--exporter dynamo)")
    if export.dynamic_batch and reference.kind == EXPORTED_PROGRAM:
        raise UsageError("an ExportedProgram's shapes were fixed when it was exported: "
                         "export it with dynamic_shapes instead of --dynamic")
    overridden = {"dynamic_shapes", "dynamic_axes", "input_names"} & set(export.torch_kwargs)
    if export.dynamic_batch and overridden:
        raise UsageError(f"dynamic_batch sets {', '.join(sorted(overridden))} itself; drop "
                         "one or the other")
    return replace(export, exporter=exporter)


def _given_candidate(reference: Reference, onnx_model: Any, folder: Path,
                     runtime: RuntimeOptions):
    """The user's ONNX model, and the ExportedProgram it was made from, if known."""
    given = onnx_model if onnx_model is not None else reference.onnx_program
    path, source = onnx_model_path(given, folder)
    # An ONNXProgram still knows its ExportedProgram, and so which call of a reused
    # module each node ran in; so does an ExportedProgram compared with an export of it.
    program = getattr(given, "exported_program", None)
    if program is None and reference.kind == EXPORTED_PROGRAM:
        program = as_translated(reference.exportable)
    candidate = _runtime_side(path, runtime)
    return candidate, source, program if names_the_values(program, candidate.nodes) else None


def _runtime_side(path: Path, runtime: RuntimeOptions) -> OnnxRuntimeSide:
    return OnnxRuntimeSide(path, provider=runtime.provider, opt_level=runtime.opt_level,
                           promote=runtime.promote)


def names_the_values(program: Any, nodes: Sequence[NodeInfo]) -> bool:
    """Whether ``program`` is the one the ONNX graph was translated from.

    Its FX node names must account for the FX nodes nearly all ONNX nodes say they
    were made from; a program the exporter decomposed differently (another torch
    version, say) would pair values of different ops.
    """
    graph = getattr(program, "graph", None)
    made_from = [node.torch.fx_node for node in nodes if node.torch and node.torch.fx_node]
    if graph is None or not made_from:
        return False
    names = {node.name for node in graph.nodes}
    return sum(name in names for name in made_from) >= 0.95 * len(made_from)


def _export_candidate(reference: Reference, given: Any, export: ExportOptions, folder: Path,
                      runtime: RuntimeOptions):
    """Export the model here; the reference runs first on the export's inputs."""
    if given is not None:
        arrays = arrange_for(reference, None, given)
    elif reference.example_inputs is not None:
        arrays = [np.asarray(tensor.detach().cpu()) for tensor in reference.example_inputs]
    else:
        raise UsageError("no inputs: pass inputs (--input FILE), or an existing ONNX model "
                         "(--onnx FILE) to draw random inputs from its input specification")
    # A forward that fails says so more plainly than the exporter, which wraps the same
    # failure in pages of advice.
    keywords = _keywords(reference, given)
    logger.info("running the PyTorch reference")
    emit(CAPTURE_STARTED, "pytorch")
    capture = reference.side.run(arrays, keywords=keywords)
    if not capture.outputs:
        raise InputError("the model's forward returned no tensor, so there is nothing to "
                         "compare; return the tensors to check")
    options = dict(export.torch_kwargs)
    if export.dynamic_batch:
        options.update(_dynamic_batch(export.exporter, reference, arrays))
    exported = export_model(reference.exportable, arrays, folder, exporter=export.exporter,
                            opset=export.opset, options=options, keywords=keywords)
    if export.save_to is not None:
        _keep_copy(exported.path, Path(export.save_to))
    return _runtime_side(exported.path, runtime), capture, exported


def _keywords(reference: Reference, given: Any) -> list[str]:
    """Names of the inputs that go by keyword (none unless they skip a parameter)."""
    if given is None:
        return []
    return keyword_order(given, forward_names=reference.input_names,
                         required=reference.required_inputs) or []


def arrange_for(reference: Reference, candidate: OnnxRuntimeSide | None,
                given: list[np.ndarray] | dict[str, np.ndarray]) -> list[np.ndarray]:
    """The given inputs in the order the model (and its ONNX graph) takes them."""
    keywords = _keywords(reference, given)
    if keywords:
        return [given[name] for name in keywords]
    onnx_names = [spec.name for spec in candidate.inputs] if candidate else None
    arrays = arrange_inputs(given, forward_names=reference.input_names, onnx_names=onnx_names)
    if candidate is None:
        check_input_count(arrays, names=reference.input_names,
                          required=reference.required_inputs,
                          variadic=reference.takes_varargs, owner=reference.side.describe()
                          .get("class", "model"))
    return arrays


def _random_samples(candidate: OnnxRuntimeSide, random: RandomInputs):
    limits = vocabulary_limits(candidate.model)
    for sample in range(random.samples):
        arrays = synthesize_inputs(candidate.inputs, seed=random.seed, dims=random.dims,
                                   sample=sample, int_high=limits)
        yield arrays, f"random (seed {random.seed}, sample {sample + 1} of {random.samples})"


def _dynamic_batch(exporter: str, reference: Reference,
                   arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """The export keywords that make dimension 0 of every input dynamic."""
    import torch

    if exporter == "dynamo":
        return {"dynamic_shapes": tuple(
            {0: torch.export.Dim.DYNAMIC} if array.ndim else None for array in arrays)}
    names = reference.input_names[: len(arrays)]
    return {"input_names": names,
            "dynamic_axes": {name: {0: "batch"} for name, array in zip(names, arrays,
                                                                        strict=True)
                             if array.ndim}}


def _compare(
    torch_capture: Capture,
    onnx_capture: Capture,
    candidate: OnnxRuntimeSide,
    call_index: Mapping[str, Mapping[str, int]],
    op_alignment: OpAlignment | None,
    torch_ops: int,
    final_outputs: list[Record],
    *,
    rtol: float,
    atol: float,
    warnings: list[str],
    granularity: str,
) -> tuple[Report, list[Pair], dict[str, list[NodeInfo]]]:
    alignment = align_modules(torch_capture, candidate.nodes, onnx_capture.values,
                              call_index=call_index)
    pairs = sorted(alignment.pairs, key=lambda pair: (
        pair.candidate.provenance.position, pair.reference.provenance.position))
    op_rows = op_records(op_alignment, rtol=rtol, atol=atol) if op_alignment else []
    unaligned, onnx_unaligned = alignment.unaligned, []
    if granularity == "op" and op_alignment is not None:
        # Module rows are not shown: their comparisons (the costly part) are skipped.
        comparisons, pairs, unaligned = op_rows, op_alignment.pairs, op_alignment.torch_only
        onnx_unaligned = op_alignment.onnx_only
    else:
        # Nested module calls often hold the same value (a block's output is its last
        # ReLU's): the same array against the same ONNX value is compared once.
        compared: dict[tuple[int, str], Any] = {}
        comparisons = []
        for index, pair in enumerate(pairs):
            key = (id(pair.reference.array), pair.candidate.name)
            if key not in compared:
                compared[key] = compare_arrays(pair.reference.array, pair.candidate.array,
                                               rtol=rtol, atol=atol)
            comparisons.append(make_record(index, pair, compared[key]))
        if op_alignment is not None:
            comparisons = aggregate_ops(comparisons, op_rows, op_alignment.pairs)
            onnx_unaligned = op_alignment.onnx_only
    decision = decide(comparisons, final_outputs, output_order={
        name: value.provenance.position for name, value in onnx_capture.values.items()})
    if detect_exporter(candidate.nodes) == "unknown" and not pairs:
        warnings.append(
            "the ONNX graph carries neither torch exporter metadata nor TorchScript-style "
            "node names, so no layer could be aligned: only the final outputs were "
            "compared (let bisect-onnx export the model, or pass the exporter's own file)"
        )
    elif not pairs and alignment.module_calls:
        warnings.append(NOTHING_ALIGNED)
    report = Report.decided(
        decision,
        rtol=rtol,
        atol=atol,
        final_outputs=final_outputs,
        comparisons=comparisons,
        coverage=_coverage(alignment, op_alignment, pairs, onnx_capture, candidate,
                           granularity, torch_ops),
        unaligned=unaligned,
        onnx_unaligned=onnx_unaligned,
        op_comparisons=op_rows if granularity == "module" else [],
        warnings=warnings,
    )
    return report, pairs, op_alignment.segments if op_alignment else {}


def _coverage(alignment: Alignment, op_alignment: OpAlignment | None, pairs: Sequence[Pair],
              onnx_capture: Capture, candidate: OnnxRuntimeSide, granularity: str,
              torch_ops: int) -> Coverage:
    coverage = Coverage(
        onnx_values=len(onnx_capture.values),
        aligned_values=len({pair.candidate.name for pair in pairs}),
        torch_modules=alignment.module_calls,
        aligned_modules=alignment.aligned_calls,
        onnx_nodes=len(candidate.nodes),
        attributed_nodes=count_attributed(candidate.nodes),
        granularity=granularity,
    )
    if op_alignment is None:
        return coverage
    return replace(
        coverage,
        attributed_nodes=coverage.attributed_nodes + len(op_alignment.inferred),
        inferred_nodes=len(op_alignment.inferred),
        torch_ops=torch_ops,
        compared_ops=len(op_alignment.pairs),
        fused_ops=len(op_alignment.fused_into),
        fx_named_values=op_alignment.fx_named_values,
        fx_named_compared=op_alignment.fx_named_compared,
    )


def _write_repro(folder: Path, report: Report, candidate: OnnxRuntimeSide,
                 reference_arrays: Mapping[str, np.ndarray],
                 candidate_arrays: Mapping[str, np.ndarray], torch_capture: Capture,
                 onnx_capture: Capture, arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """Write the first divergence's minimal repro; describe it for the report."""
    reference_values = dict(reference_arrays)
    reference_values.update({cand.name: ref.array for ref, cand in
                             zip(torch_capture.outputs, onnx_capture.outputs, strict=False)})
    repro = write_repro(
        folder,
        model=candidate.model,
        model_dir=candidate.path.resolve().parent,
        failing_value=_repro_value(report, onnx_capture),
        reference_values=reference_values,
        candidate_values=candidate_arrays,
        graph_inputs={spec.name: array for spec, array in zip(candidate.inputs, arrays,
                                                               strict=True)},
        rtol=report.rtol,
        atol=report.atol,
        environment=report.environment,
    )
    return {"folder": str(repro.folder), "nodes": repro.nodes, "inputs": repro.inputs,
            "reproduces": repro.reproduces}


def _repro_value(report: Report, onnx_capture: Capture) -> str:
    """The value the repro recomputes: the culprit's, or its fused kernel's output.

    A repro must show what the production session computes, and a value ONNX Runtime
    fused away is not computed there.
    """
    culprit = report.first_culprit or report.first_divergence
    if culprit.onnx_value in onnx_capture.values:
        return culprit.onnx_value
    kernel = (report.attribution or {}).get("inside_kernel") or {}
    return kernel.get("kernel_output") or report.first_divergence.onnx_value


def compare_final_outputs(
    torch_outputs: Sequence[CapturedValue],
    onnx_outputs: Sequence[CapturedValue],
    *,
    rtol: float,
    atol: float,
    warnings: list[str],
) -> list[Record]:
    """The final outputs, always compared, aligned or not (pairs by position)."""
    if len(torch_outputs) != len(onnx_outputs):
        warnings.append(
            f"PyTorch returned {len(torch_outputs)} tensor output(s) and the ONNX graph has "
            f"{len(onnx_outputs)}: only the first {min(len(torch_outputs), len(onnx_outputs))} "
            "were compared"
        )
    return [
        make_record(index, Pair(ref, cand),
                    compare_arrays(ref.array, cand.array, rtol=rtol, atol=atol), final=True)
        for index, (ref, cand) in enumerate(zip(torch_outputs, onnx_outputs, strict=False))
    ]


def worst_report(reports: Sequence[Report]) -> Report:
    """The report of the worst sample: a divergence first, then the largest output error."""
    def severity(report: Report) -> tuple[bool, float]:
        needed = [record.min_passing_atol for record in report.final_outputs if record.failed]
        return report.diverged, max((math.inf if n is None else n for n in needed),
                                    default=0.0)

    worst = max(reports, key=severity)
    if len(reports) > 1:
        diverged = sum(report.diverged for report in reports)
        summary = (f"worst of {len(reports)} random samples ({diverged} diverged): "
                   f"{worst.reference['inputs']}")
        worst.note = f"{worst.note} {summary}" if worst.note else summary
    return worst


def _check_opset(report: Report, export: ExportOptions, candidate: OnnxRuntimeSide) -> None:
    if export.opset is not None and candidate.opset != export.opset:
        report.warnings.append(f"asked for opset {export.opset}, but the {export.exporter} "
                               f"exporter produced opset {candidate.opset}")


def as_arrays(inputs: Any) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Accept arrays, tensors, sequences and mappings of them; always numpy out."""
    if isinstance(inputs, Mapping):
        return {str(key): _to_array(value) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return [_to_array(value) for value in inputs]
    return [_to_array(inputs)]


def _to_array(value: Any) -> np.ndarray:
    # A torch.Tensor, recognised without importing torch.
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        raise InputError(f"an input of type {type(value).__name__} is not numeric data "
                         f"(numpy makes it dtype {array.dtype}); pass arrays or tensors")
    # Big-endian data (saved on another machine) is fine for numpy, not for torch or ORT.
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def onnx_model_path(onnx_model: Any, folder: Path) -> tuple[Path, str]:
    """A path ORT can read, and how to name the model in the report."""
    if isinstance(onnx_model, (str, Path)):
        return Path(onnx_model), str(onnx_model)
    import onnx

    path = folder / "given.onnx"
    if isinstance(onnx_model, onnx.ModelProto):
        if onnx_model.ByteSize() > _PROTO_LIMIT:
            raise InputError("the onnx.ModelProto is over 2 GB, the most one protobuf "
                             "message can be written as; save it with external data "
                             "(onnx.save(..., save_as_external_data=True)) and pass the path")
        if any(external_location(tensor) is not None
               for tensor in graph_tensors(onnx_model.graph)):
            raise InputError("the onnx.ModelProto names external weights relative to a "
                             "folder it no longer knows (loaded with load_external_data="
                             "False?); pass the path of its .onnx file instead")
        onnx.save(onnx_model, str(path))
        return path, "(onnx.ModelProto)"
    if hasattr(onnx_model, "model_proto") and hasattr(onnx_model, "save"):
        onnx_model.save(str(path))  # a torch.onnx.ONNXProgram, external data included
        return path, "(torch.onnx.ONNXProgram)"
    raise InputError(f"onnx_model must be a path, an onnx.ModelProto or a "
                     f"torch.onnx.ONNXProgram, got {type(onnx_model).__name__}")


# The largest protobuf message there is; a bigger model must keep its weights outside.
_PROTO_LIMIT = 2**31 - 1


def _keep_copy(exported: Path, target: Path) -> None:
    """Copy the export to where the user asked, its weights inline or beside it.

    External weights are streamed into one data file named after the target (nothing
    else there is overwritten), never all in memory; copied, not linked, because the
    export's own data file is still read in this run (a repro, a template).
    """
    try:
        copy_model(exported, target, link=False)
    except OSError as error:
        raise InputError(f"cannot save the ONNX export to {target}: {error.strerror}; "
                         "choose a writable path for --save-onnx") from error


def _environment(candidate: OnnxRuntimeSide, exporter: str) -> dict[str, Any]:
    import onnx
    import onnxruntime
    import torch

    return {
        "bisect_onnx": __version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "provider": candidate.provider,
        "opt_level": candidate.opt_level,
        "promote": candidate.promote,
        "cpu_count": os.cpu_count(),
        "intra_op_threads": "onnxruntime default (one per physical core)",
        "exporter": exporter,
        "opset": candidate.opset,
    }


def _cpu_name() -> str:
    """The CPU's model name (numerics differ between CPUs: AVX-512 kernels, say)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
