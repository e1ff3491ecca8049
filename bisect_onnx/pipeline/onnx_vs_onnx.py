"""ONNX against ONNX: a reference ONNX model and a candidate, layer by layer.

After export come float16 conversion, quantization, graph simplification and other
execution providers, and each can break parity again. The reference is an ONNX model
in ONNX Runtime (every value promoted) or in ONNX's reference evaluator; the
candidate is an ONNX model in ONNX Runtime with its own provider and optimization
level (the same file, or another: its float16 conversion, its QDQ version, its
simplified form). Values are paired by name through the Casts and Q/DQ pairs
converters insert (:mod:`bisect_onnx.align.onnx_pairs`), compared with tolerances that
follow the candidate's precision (:mod:`bisect_onnx.judge.tolerances`), and decided and
reported exactly as the PyTorch form is.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.align.onnx_pairs import CandidateGroups, ValuePair, pair_graphs, pair_uncaptured
from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.events import BISECTION_STARTED, CAPTURE_STARTED, emit
from bisect_onnx.judge.compare import ArrayComparison, check_tolerances, compare_arrays
from bisect_onnx.judge.records import Coverage, Record, Report, make_record
from bisect_onnx.judge.tolerances import (
    Tolerance,
    ToleranceRule,
    default_tolerance,
    precision_of,
    quantized_tolerance,
    read_tolerance_file,
    rule_for,
)
from bisect_onnx.judge.verdict import decide
from bisect_onnx.pipeline.pytorch_vs_onnx import (
    CAPTURE_DIFFERS_WARNING,
    RandomInputs,
    RuntimeOptions,
    as_arrays,
    onnx_model_path,
    worst_report,
)
from bisect_onnx.report.context import culprit_context
from bisect_onnx.report.repro import attach_repro, write_repro
from bisect_onnx.runtime.onnx_side import NodeInfo, OnnxRuntimeSide, node_provenance
from bisect_onnx.runtime.reference_side import ReferenceEvaluatorSide, reference_side
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search import modes as search_modes
from bisect_onnx.search.blame import attribute_divergence
from bisect_onnx.search.modes import adopt_bisection, outputs_differ
from bisect_onnx.search.probes import Checkpoint, ProbeBisection, ProbeRunner
from bisect_onnx.sources.file_kinds import looks_like_onnx, read_head
from bisect_onnx.sources.random_inputs import synthesize_inputs, vocabulary_limits
from bisect_onnx.version import __version__

if TYPE_CHECKING:
    import onnx

__all__ = ["bisect_onnx_models", "against_requested", "bisect_from_args"]

logger = logging.getLogger(__name__)

#: Below this share of values surviving ONNX Runtime's optimized graph, fusion-preserving
#: capture says little (float16 nodes run through Casts ONNX Runtime inserts on CPU, QDQ
#: pairs fused into QLinear kernels): every value is promoted instead.
_SURVIVAL_FLOOR = 0.5

STRUCTURAL = (
    "the candidate's value names do not match the reference's (simplified, optimized "
    "offline or renamed): its values were matched by structure, each with a confidence "
    "(matched_by, match_confidence); check the match of the first divergence")
CAPTURE_FELL_BACK = (
    "only {survivors} of {values} candidate values survive ONNX Runtime's optimized graph "
    "(float16 nodes run through inserted Casts, QDQ pairs fused into QLinear kernels): "
    "every value was promoted instead, which changes what ONNX Runtime fuses")
UNUSED_RULE = "tolerance rule {where} ({pattern}) matched no compared value"
NOTHING_TO_COMPARE = (
    "the reference and the candidate are the same model run the same way; give a "
    "candidate (--against FILE), another optimization level (--against-opt-level) or "
    "provider (--against-provider), or --against-reference-evaluator")
# Options of the PyTorch form that mean nothing when two ONNX models are compared.
_TORCH_ONLY_OPTIONS = {"onnx": "--onnx", "exporter": "--exporter", "opset": "--opset",
                       "dynamic": "--dynamic", "save_onnx": "--save-onnx",
                       "granularity": "--granularity", "trust_pickle": "--trust-pickle",
                       "max_memory": "--max-memory"}
NO_MEMORY_BUDGET = (
    "max_memory applies to bisect(); bisect_onnx_models captures every value of both "
    "models: drop it from {which}")
REFERENCE_PROMOTES_ALL = (
    "the reference's values are always all promoted; drop promote from reference_runtime "
    "(candidate_runtime's promote is the candidate's)")


def bisect_onnx_models(
    reference: str | Path | onnx.ModelProto,
    candidate: str | Path | onnx.ModelProto | None = None,
    inputs: Any = None,
    *,
    reference_runtime: RuntimeOptions | None = None,
    candidate_runtime: RuntimeOptions | None = None,
    reference_evaluator: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: str | Path | Mapping[str, tuple[float, float]] | None = None,
    random_inputs: RandomInputs | None = None,
    repro_dir: str | Path | None = None,
    all_culprits: bool = False,
    model_label: str | None = None,
) -> Report:
    """Compare two ONNX models (or one model run two ways), value by value.

    Args:
        reference: The reference ONNX model: a path or an ``onnx.ModelProto``.
        candidate: The candidate ONNX model; ``None`` runs the reference model again,
            as ``candidate_runtime`` says.
        inputs: One array, a sequence in the graph's input order, or a mapping by the
            reference graph's input names; ``None`` draws random inputs.
        reference_runtime: Provider and optimization level of the reference in ONNX
            Runtime (every value is promoted, whatever ``promote`` says).
        candidate_runtime: Provider, optimization level and promotion of the
            candidate; by default the reference's provider and level.
        reference_evaluator: Run the reference in ``onnx.reference`` instead of ONNX
            Runtime (standard ops only).
        rtol: Relative tolerance; ``None`` follows the narrower precision of the two
            models (float16 and bfloat16 looser than float32).
        atol: Absolute tolerance; ``None`` likewise (and a quantized value's scale).
        tolerances: Per-value tolerances: a file of ``PATTERN RTOL ATOL`` lines, or a
            mapping ``{pattern: (rtol, atol)}``; the first matching pattern wins.
        random_inputs: Seed, free dimensions and sample count of drawn inputs; the
            report is the worst sample's.
        repro_dir: On divergence, write there a standalone repro of the first culprit
            (``<dir>/sample-<k>`` for each diverging random sample), the reference's
            values fed to the candidate's nodes.
        all_culprits: Check every failing value on the reference's values and list
            each one that introduces error (``report.culprits``), not only the first.
        model_label: How the reference is named in the report.

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`, as :func:`bisect_onnx.bisect` gives.
    """
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None:
            check_tolerances(**{"rtol": 0.0, "atol": 0.0, name: value})
    rules = _rules(tolerances)
    reference_runtime = reference_runtime or RuntimeOptions()
    candidate_runtime = candidate_runtime or RuntimeOptions(
        provider=reference_runtime.provider, opt_level=reference_runtime.opt_level)
    _check_runtimes(reference_runtime, candidate_runtime)
    random_inputs = random_inputs or RandomInputs()
    _check_samples(inputs, random_inputs)
    if (candidate is None and not reference_evaluator and (
            reference_runtime.provider, reference_runtime.opt_level) == (
            candidate_runtime.provider, candidate_runtime.opt_level)):
        raise UsageError(NOTHING_TO_COMPARE)
    emit(BISECTION_STARTED, model_label or str(reference))
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir:
        reference_path, reference_label = _model_path(reference, Path(workdir), "reference")
        candidate_path, candidate_label = (
            (reference_path, reference_label) if candidate is None
            else _model_path(candidate, Path(workdir), "candidate"))
        reference_model = reference_side(reference_path, provider=reference_runtime.provider,
                                         opt_level=reference_runtime.opt_level,
                                         evaluator=reference_evaluator)
        candidate_model = OnnxRuntimeSide(candidate_path, **_runtime_keywords(candidate_runtime))
        fell_back: str | None = None  # the promote-all fallback, said in every sample
        reports = []
        for number, (arrays, description) in enumerate(
                _reference_inputs(reference_model, inputs, random_inputs), start=1):
            candidate_arrays = _candidate_inputs(arrays, reference_model, candidate_model)
            if not reference_evaluator:
                emit(CAPTURE_STARTED, "onnxruntime (reference)")
            reference_capture = reference_model.run(arrays)
            emit(CAPTURE_STARTED, "onnxruntime")
            candidate_model, candidate_capture, fallback = _run_candidate(candidate_model,
                                                                          candidate_arrays)
            fell_back = fell_back or fallback
            report, values = _sample_report(
                reference_model, candidate_model, reference_capture, candidate_capture,
                arrays, candidate_arrays, rtol=rtol, atol=atol, rules=rules,
                all_culprits=all_culprits, warnings=[fell_back] if fell_back else [])
            report.reference = {**reference_model.describe(), "model": reference_label,
                                "inputs": description}
            report.candidate = {**candidate_model.describe(), "model": candidate_label}
            attach_repro(report, repro_dir, sample=None if inputs is not None else number,
                         write=partial(_write_repro, report=report,
                                       candidate=candidate_model, values=values))
            reports.append(report)
        return worst_report(reports)


@dataclass
class _Values:
    """One sample's arrays under the candidate's value names, in the candidate's dtypes.

    What local checks and a repro feed the candidate's nodes.
    """

    reference: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]
    graph_inputs: dict[str, np.ndarray]


@dataclass
class _Paired:
    """How one sample's values were paired and judged, beyond its report."""

    judge: _Judge
    groups: CandidateGroups
    pairs: list[ValuePair]
    outputs: list[ValuePair]
    """The final outputs' pairs, by position."""
    unpaired_fused: list[str]
    """Reference values whose candidate value was not captured (fused away)."""
    nodes: dict[str, NodeInfo]
    reference: onnx.ModelProto
    """The reference graph (what it holds decides how a value pairs)."""


def _sample_report(reference: Any, candidate: OnnxRuntimeSide, reference_capture: Capture,
                   candidate_capture: Capture, arrays: Sequence[np.ndarray],
                   candidate_arrays: Sequence[np.ndarray], *, rtol: float | None,
                   atol: float | None, rules: Sequence[ToleranceRule], all_culprits: bool,
                   warnings: list[str]) -> tuple[Report, _Values]:
    """One sample's report, and its values under the candidate's names.

    The verdict is production's; the first divergence is probed in production where
    the capture cannot show it; failing values are checked for whether their nodes
    introduced the error.
    """
    production, runner = search_modes.production_outputs(candidate, candidate_capture,
                                                          candidate_arrays)
    capture_differs = outputs_differ(candidate_capture.outputs, production)
    # The verdict is production's, whatever the capture session computed.
    judged = Capture(values=candidate_capture.values, outputs=production)
    report, paired = _compare(reference, candidate, reference_capture, judged, arrays,
                              rtol=rtol, atol=atol, rules=rules, warnings=warnings)
    report.environment = _environment(reference, candidate)
    report.capture = candidate.describe_capture()
    if candidate.outputs_match_production is False:
        report.warnings.append(CAPTURE_DIFFERS_WARNING.format(
            difference=candidate.production_difference, mode=report.capture.get("mode")))
    candidate_values = {name: value.array for name, value in candidate_capture.values.items()}
    pairs = list(paired.pairs)
    if report.diverged and (capture_differs or search_modes.no_value_fails(report)):
        # The capture may not show what production computes: probe production.
        runner = runner or ProbeRunner(candidate, candidate_arrays)
        probed = _probe_production(
            report, paired, candidate, runner, reference_capture,
            search_modes.CAPTURE_DIFFERS if capture_differs else search_modes.NO_VALUE_FAILS)
        if probed is not None:
            bisection, probe_pairs = probed
            known = {pair.candidate for pair in pairs}
            pairs.extend(pair for pair in probe_pairs if pair.candidate not in known)
            candidate_values.update({name: value.array for name, value
                                     in bisection.capture.values.items()})
    candidate_values.update({value.name: value.array for value in production})
    pairs.extend(paired.outputs)
    values = _Values(
        reference=_as_candidate_values(pairs, reference_capture, candidate_values),
        candidate=candidate_values,
        graph_inputs={spec.name: array for spec, array in zip(candidate.inputs,
                                                               candidate_arrays, strict=True)})
    if report.diverged or report.hidden_divergences:  # hidden ones have culprits too
        attribute_divergence(report, candidate, values.reference, values.candidate,
                             values.graph_inputs, everything=all_culprits,
                             compare=_local_judge(paired.judge, pairs, reference_capture))
    report.culprit = culprit_context(report.first_culprit or report.first_divergence,
                                     candidate, reference_capture, judged, report.comparisons)
    return report, values


def _probe_production(report: Report, paired: _Paired, candidate: OnnxRuntimeSide,
                      runner: ProbeRunner, reference_capture: Capture,
                      reason: str) -> tuple[ProbeBisection, list[ValuePair]] | None:
    """Bisect production for the first failing paired value; adopt it into the report.

    Checkpoints are the candidate's values paired with a reference value (those the
    capture lacks too, paired by name), each judged as its row is: converted as its
    pair says, with its own tolerance.
    """
    producers = {output: node for node in candidate.nodes for output in node.outputs}
    judge = paired.judge
    by_value: dict[str, ValuePair] = {}
    checkpoints = []
    uncaptured = pair_uncaptured(paired.reference, {
        name: reference_capture.values[name].array for name in paired.unpaired_fused},
        paired.groups)
    for pair in [*paired.pairs, *uncaptured]:
        node = producers.get(pair.candidate)
        reference = reference_capture.values[pair.reference]
        if node is None or pair.candidate in by_value or reference.array.dtype.kind not in "fc":
            continue
        by_value[pair.candidate] = pair
        checkpoints.append(Checkpoint(pair.candidate, reference, node))
    if not checkpoints:
        return None
    checkpoints.sort(key=lambda checkpoint: checkpoint.node.index)
    logger.info("bisecting %d checkpoints with probes of the production graph",
                len(checkpoints))

    def compare(checkpoint: Checkpoint, array: np.ndarray) -> ArrayComparison:
        pair = by_value[checkpoint.name]
        return judge.compare(checkpoint.reference.array, array, pair, judge.tolerance(pair))[0]

    def make_row(name: str, probed: CapturedValue) -> Record:
        pair = by_value[name]
        return judge.record(0, reference_capture.values[pair.reference], probed, pair,
                            paired.nodes)

    bisection = runner.bisect(checkpoints, rtol=report.rtol, atol=report.atol,
                              compare=compare)
    adopt_bisection(report, bisection, reason,
                    {checkpoint.name: checkpoint.reference for checkpoint in checkpoints},
                    {output: node.index for output, node in producers.items()},
                    make_row=make_row)
    return bisection, list(by_value.values())


def _local_judge(judge: _Judge, pairs: Sequence[ValuePair],
                 reference_capture: Capture) -> Callable[[str, np.ndarray], ArrayComparison]:
    """Judge a candidate value recomputed on the reference's inputs as its row was judged.

    Against the reference's own value, converted as its pair says (a float before a
    QDQ pair put through it), with the value's own tolerance.
    """
    by_candidate: dict[str, ValuePair] = {}
    for pair in pairs:
        by_candidate.setdefault(pair.candidate, pair)
    references = _reference_values(reference_capture)

    def compare(name: str, local: np.ndarray) -> ArrayComparison:
        pair = by_candidate[name]
        return judge.compare(references[pair.reference].array, local, pair,
                             judge.tolerance(pair))[0]

    return compare


def _reference_values(capture: Capture) -> dict[str, CapturedValue]:
    """The reference's values and final outputs by name."""
    return {**{value.name: value for value in capture.outputs}, **capture.values}


def _as_candidate_values(pairs: Sequence[ValuePair], reference_capture: Capture,
                         candidate_values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's values under the candidate's names, in the candidate's dtypes.

    A float16 candidate's nodes are fed float16 arrays; a QDQ candidate's
    DequantizeLinear output takes the float tensor it stands for. A QuantizeLinear's
    integer output has no reference of its type (left out: not checked locally).
    """
    by_name = _reference_values(reference_capture)
    converted: dict[str, np.ndarray] = {}
    for pair in pairs:
        candidate = candidate_values.get(pair.candidate)
        reference = by_name.get(pair.reference)
        if (candidate is None or reference is None or pair.how == "dequantized"
                or pair.candidate in converted):
            continue
        array, candidate = np.asarray(reference.array), np.asarray(candidate)
        if array.dtype != candidate.dtype and array.dtype.kind == candidate.dtype.kind == "f":
            array = array.astype(candidate.dtype)
        converted[pair.candidate] = array
    return converted


def _write_repro(folder: Path, report: Report, candidate: OnnxRuntimeSide,
                 values: _Values) -> dict[str, Any]:
    """Write the first culprit's minimal repro, the reference's values as the expected."""
    record = report.first_culprit or report.first_divergence
    if record.onnx_value not in values.candidate:
        record = report.first_divergence
    repro = write_repro(
        folder,
        model=candidate.model,
        model_dir=candidate.path.resolve().parent,
        failing_value=record.onnx_value,
        reference_values=values.reference,
        candidate_values=values.candidate,
        graph_inputs=values.graph_inputs,
        rtol=report.rtol if record.rtol is None else record.rtol,
        atol=report.atol if record.atol is None else record.atol,
        environment=report.environment,
        reference_label="the reference model",
    )
    return {"folder": str(repro.folder), "nodes": repro.nodes, "inputs": repro.inputs,
            "reproduces": repro.reproduces}


def _compare(reference: Any, candidate: OnnxRuntimeSide, reference_capture: Capture,
             candidate_capture: Capture, arrays: Sequence[np.ndarray], *,
             rtol: float | None, atol: float | None, rules: Sequence[ToleranceRule],
             warnings: list[str]) -> tuple[Report, _Paired]:
    """Pair, compare and decide; the report without its descriptions, and the pairing."""
    candidate_precision = precision_of(candidate.model)
    default, precision = default_tolerance(precision_of(reference.model), candidate_precision)
    base = Tolerance(default.rtol if rtol is None else rtol,
                     default.atol if atol is None else atol)
    judge = _Judge(base, rules, scale_tolerance=atol is None,
                   converted=precision != "float32" or candidate_precision != precision_of(
                       reference.model))
    groups = CandidateGroups(candidate.model, str(candidate.path.resolve().parent))
    graph_inputs = {spec.name: array for spec, array in zip(reference.inputs, arrays,
                                                            strict=True)}
    reference_arrays = {name: value.array for name, value in reference_capture.values.items()}
    candidate_arrays = {name: value.array for name, value in candidate_capture.values.items()}
    pairing = pair_graphs(reference.model, groups, reference_arrays, candidate_arrays,
                          graph_inputs=graph_inputs,
                          agree=lambda cand, ref: judge.compare(ref, cand)[0].passed)
    if pairing.structural:
        warnings.append(STRUCTURAL)
    nodes = {node.name: node for node in candidate.nodes}
    comparisons = [
        judge.record(index, reference_capture.values[pair.reference],
                     candidate_capture.values[pair.candidate], pair, nodes)
        for index, pair in enumerate(pairing.pairs)]
    final_outputs, output_pairs = [], []
    for index, (ref, cand) in enumerate(zip(reference_capture.outputs,
                                            candidate_capture.outputs, strict=False)):
        pair = ValuePair(ref.name, cand.name, groups.computing_node(groups.source(cand.name)),
                         "output", groups.quantization(cand.name))
        output_pairs.append(pair)
        final_outputs.append(judge.record(index, ref, cand, pair, nodes, final=True))
    if len(reference_capture.outputs) != len(candidate_capture.outputs):
        warnings.append(f"the reference has {len(reference_capture.outputs)} outputs and the "
                        f"candidate {len(candidate_capture.outputs)}: the first "
                        f"{len(final_outputs)} were compared, by position")
    warnings.extend(UNUSED_RULE.format(where=rule.where, pattern=rule.pattern)
                    for rule in rules if rule not in judge.used)
    decision = decide(comparisons, final_outputs, output_order={
        name: value.provenance.position for name, value in candidate_capture.values.items()})
    compared_nodes = {pair.node for pair in pairing.pairs if pair.node}
    report = Report.decided(
        decision,
        rtol=base.rtol,
        atol=base.atol,
        final_outputs=final_outputs,
        comparisons=comparisons,
        coverage=Coverage(onnx_values=len(reference_capture.values),
                          aligned_values=len(pairing.pairs), torch_modules=0,
                          aligned_modules=0, onnx_nodes=len(candidate.nodes),
                          attributed_nodes=len(compared_nodes), granularity="value"),
        unaligned=pairing.unpaired,
        warnings=warnings,
        tolerance_basis=_tolerance_basis(precision, rtol, atol, rules),
    )
    fused = [item.name for item in pairing.unpaired if item.kind == "runtime-fused"]
    return report, _Paired(judge, groups, pairing.pairs, output_pairs, fused, nodes,
                           reference.model)


class _Judge:
    """Each pair's tolerance (file rule, quantization scale, precision default) and records."""

    def __init__(self, base: Tolerance, rules: Sequence[ToleranceRule], *,
                 scale_tolerance: bool, converted: bool) -> None:
        self.base = base
        self.rules = rules
        self.scale_tolerance = scale_tolerance
        self.converted = converted
        self.used: list[ToleranceRule] = []

    def tolerance(self, pair: ValuePair) -> Tolerance:
        rule = rule_for(self.rules, pair.reference, pair.candidate)
        if rule is not None:
            if rule not in self.used:
                self.used.append(rule)
            return rule.tolerance
        if pair.quantization is not None and self.scale_tolerance:
            return quantized_tolerance(self.base, pair.quantization.step)
        return self.base

    def compare(self, reference: np.ndarray, candidate: np.ndarray,
                pair: ValuePair | None = None, tolerance: Tolerance | None = None,
                ) -> tuple[ArrayComparison, float | None]:
        """Compare in the wider of the two float types; SQNR for a converted value."""
        tolerance = tolerance or self.base
        reference, candidate = np.asarray(reference), np.asarray(candidate)
        if pair is not None and pair.quantization is not None:
            if pair.how == "dequantized":
                candidate = pair.quantization.dequantize(candidate)
            elif pair.how == "requantized":
                candidate = pair.quantization.round_trip(candidate)
            elif reference.dtype.kind in "iu" and candidate.dtype.kind in "iu":
                # A QuantizeLinear's integers on both sides: compared as the floats they
                # stand for, so that the tolerance's steps of the scale mean the same.
                reference = pair.quantization.dequantize(reference)
                candidate = pair.quantization.dequantize(candidate)
        sqnr = None
        if reference.dtype.kind == "f" and candidate.dtype.kind == "f":
            if reference.dtype != candidate.dtype:
                wider = np.promote_types(reference.dtype, candidate.dtype)
                reference, candidate = reference.astype(wider), candidate.astype(wider)
            if self.converted or (pair is not None and pair.quantization is not None):
                sqnr = signal_to_noise(reference, candidate)
        result = compare_arrays(reference, candidate, rtol=tolerance.rtol, atol=tolerance.atol)
        return result, sqnr

    def record(self, index: int, reference: CapturedValue, candidate: CapturedValue,
               pair: ValuePair, nodes: Mapping[str, NodeInfo], *, final: bool = False) -> Record:
        tolerance = self.tolerance(pair)
        result, sqnr = self.compare(reference.array, candidate.array, pair, tolerance)
        node = nodes.get(pair.node or "")
        shown = CapturedValue(candidate.name, candidate.array,
                              node_provenance(node, candidate.provenance.position)
                              if node is not None else candidate.provenance)
        record = make_record(index, Pair(reference, shown), result, final=final)
        origin = reference.provenance if reference.provenance.module is not None else (
            shown.provenance)
        return replace(
            record,
            torch_module=None if final else (origin.module or ""),
            torch_op=origin.torch_op,
            source=origin.source,
            candidate_dtype=str(candidate.array.dtype),
            reference_value=reference.name,
            reference_node=reference.provenance.node,
            sqnr_db=sqnr,
            rtol=None if tolerance == self.base else tolerance.rtol,
            atol=None if tolerance == self.base else tolerance.atol,
            matched_by=pair.how if pair.confidence is not None else None,
            match_confidence=pair.confidence,
        )


def signal_to_noise(reference: np.ndarray, candidate: np.ndarray) -> float | None:
    """``10 log10(sum(ref^2) / sum((ref - cand)^2))`` over finite elements, in dB.

    ``inf`` when the two agree exactly; ``None`` when there is nothing to measure.
    """
    ref = reference.astype(np.float64)
    cand = candidate.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(cand)
    if ref.shape != cand.shape or not finite.any():
        return None
    signal = float(np.sum(ref[finite] ** 2))
    noise = float(np.sum((ref[finite] - cand[finite]) ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return None
    return 10.0 * math.log10(signal / noise)


def _run_candidate(candidate: OnnxRuntimeSide, arrays: Sequence[np.ndarray],
                   ) -> tuple[OnnxRuntimeSide, Capture, str | None]:
    """Capture the candidate; promote every value when too few survive optimization.

    Returns the side that captured (a promote-all one after a fallback, kept for the
    next samples), its capture, and the warning a fallback gives.
    """
    plan = candidate.prepare()  # decided from production's graph, before any capture
    if (plan.promoted is not None and plan.values
            and plan.survivors < _SURVIVAL_FLOOR * plan.values):
        candidate = OnnxRuntimeSide(candidate.path, provider=candidate.provider,
                                    opt_level=candidate.opt_level, promote="all")
        return candidate, candidate.run(arrays), CAPTURE_FELL_BACK.format(
            survivors=plan.survivors, values=plan.values)
    return candidate, candidate.run(arrays), None


def _rules(tolerances: Any) -> list[ToleranceRule]:
    if tolerances is None:
        return []
    if isinstance(tolerances, Mapping):
        rules = []
        for pattern, pair in tolerances.items():
            rtol, atol = pair
            check_tolerances(rtol, atol)
            rules.append(ToleranceRule(str(pattern), Tolerance(float(rtol), float(atol)),
                                       f"tolerances[{pattern!r}]"))
        return rules
    return read_tolerance_file(tolerances)


def _tolerance_basis(precision: str, rtol: float | None, atol: float | None,
                     rules: Sequence[ToleranceRule]) -> str | None:
    parts = []
    if precision != "float32" and (rtol is None or atol is None):
        parts.append(f"{precision} defaults")
    if rules:
        parts.append(f"{len(rules)} per-value rule(s) from {rules[0].where.rsplit(':', 1)[0]}")
    return "; ".join(parts) or None


def _model_path(model: Any, folder: Path, label: str) -> tuple[Path, str]:
    """A path ONNX Runtime can read, and how the report names the model."""
    if isinstance(model, (str, Path)):
        check_onnx_file(Path(model), label)
        return Path(model), str(model)
    import onnx

    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"the {label} must be a path or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    folder = folder / label  # each model its own folder: the proto is saved as given.onnx
    folder.mkdir()
    return onnx_model_path(model, folder)


def check_onnx_file(path: Path, label: str) -> None:
    """Refuse, in one line, a path that is not an ONNX file."""
    head = read_head(path, 16, label=f"{label} file", expected="an .onnx file")
    if not looks_like_onnx(head):
        raise InputError(f"{label} file {path} is not an ONNX model; pass an .onnx file")


def _runtime_keywords(runtime: RuntimeOptions) -> dict[str, str]:
    return {"provider": runtime.provider, "opt_level": runtime.opt_level,
            "promote": runtime.promote}


def _check_runtimes(reference: RuntimeOptions, candidate: RuntimeOptions) -> None:
    """Refuse the runtime options this comparison would otherwise ignore."""
    for which, runtime in (("reference_runtime", reference), ("candidate_runtime", candidate)):
        if runtime.max_memory is not None:
            raise UsageError(NO_MEMORY_BUDGET.format(which=which))
    if reference.promote != RuntimeOptions.promote:
        raise UsageError(REFERENCE_PROMOTES_ALL)


def _check_samples(inputs: Any, random_inputs: RandomInputs) -> None:
    samples = random_inputs.samples
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise UsageError(f"samples must be a whole number >= 1, got {samples!r}")
    if inputs is not None and samples != 1:
        raise UsageError("--samples applies to random inputs: drop it, or drop the given "
                         "inputs")


def _reference_inputs(reference: Any, inputs: Any, random_inputs: RandomInputs,
                      ) -> Iterator[tuple[list[np.ndarray], str]]:
    """The reference graph's inputs: given (arranged by name), or samples drawn from it."""
    from bisect_onnx.sources.loading import arrange_inputs, check_against_onnx

    if inputs is None:
        limits = vocabulary_limits(reference.model)
        for sample in range(random_inputs.samples):
            arrays = synthesize_inputs(reference.inputs, seed=random_inputs.seed,
                                       dims=random_inputs.dims, sample=sample,
                                       int_high=limits)
            yield arrays, (f"random (seed {random_inputs.seed}, sample {sample + 1} of "
                           f"{random_inputs.samples})")
        return
    arrays = arrange_inputs(as_arrays(inputs),
                            forward_names=[spec.name for spec in reference.inputs])
    check_against_onnx(arrays, reference.inputs)
    yield arrays, "given"


def _candidate_inputs(arrays: Sequence[np.ndarray], reference: Any,
                      candidate: OnnxRuntimeSide) -> list[np.ndarray]:
    """The same inputs for the candidate, floats cast to its input types (float16 I/O)."""
    from bisect_onnx.sources.loading import check_against_onnx

    if len(candidate.inputs) != len(arrays):
        raise InputError(f"the reference takes {len(arrays)} input(s) and the candidate "
                         f"{len(candidate.inputs)}; compare models with the same inputs")
    converted = [array.astype(spec.dtype) if array.dtype.kind == "f" and spec.dtype.kind == "f"
                 else array for array, spec in zip(arrays, candidate.inputs, strict=True)]
    check_against_onnx(converted, candidate.inputs)
    return converted


def _environment(reference: Any, candidate: OnnxRuntimeSide) -> dict[str, Any]:
    import onnx
    import onnxruntime

    evaluator = isinstance(reference, ReferenceEvaluatorSide)
    return {
        "bisect_onnx": __version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "reference_runtime": "onnx.reference" if evaluator else "onnxruntime",
        "reference_provider": None if evaluator else reference.provider,
        "reference_opt_level": None if evaluator else reference.opt_level,
        "provider": candidate.provider,
        "opt_level": candidate.opt_level,
        "promote": candidate.promote,
        "exporter": "unknown",
        "opset": candidate.opset,
    }


# The command line ---------------------------------------------------------------------

def against_requested(args: argparse.Namespace) -> bool:
    """Whether the command line asks for an ONNX-against-ONNX comparison."""
    return bool(args.against is not None or args.against_opt_level is not None
                or args.against_provider is not None or args.against_reference_evaluator)


def bisect_from_args(args: argparse.Namespace) -> Report:
    """Run the ONNX-against-ONNX form from parsed CLI arguments (MODEL is the reference)."""
    from bisect_onnx.sources.loading import load_input_files
    from bisect_onnx.sources.random_inputs import parse_dim_options

    given = [option for name, option in _TORCH_ONLY_OPTIONS.items()
             if getattr(args, name, None) not in (None, False)]
    if given:
        raise UsageError(f"{', '.join(given)} apply to a PyTorch MODEL; drop them when "
                         "comparing two ONNX models")
    model = Path(args.model)
    head = b"" if _names_a_factory(args.model) and not model.exists() else read_head(
        model, 16, label="MODEL file", expected="an .onnx file")
    if not looks_like_onnx(head):
        raise UsageError(f"--against, --against-opt-level, --against-provider and "
                         f"--against-reference-evaluator compare two ONNX models, and MODEL "
                         f"{args.model} is not an ONNX file; pass the reference .onnx as MODEL "
                         "(a PyTorch MODEL is compared with --onnx FILE)")
    inputs = load_input_files(args.input) if args.input else None
    return bisect_onnx_models(
        model,
        args.against,
        inputs,
        reference_runtime=RuntimeOptions(provider=args.provider, opt_level=args.opt_level),
        candidate_runtime=RuntimeOptions(
            provider=args.against_provider or args.provider,
            opt_level=args.against_opt_level or args.opt_level, promote=args.promote),
        reference_evaluator=args.against_reference_evaluator,
        rtol=args.rtol,
        atol=args.atol,
        tolerances=args.tolerances,
        random_inputs=RandomInputs(seed=args.seed, dims=parse_dim_options(args.dim),
                                   samples=args.samples),
        repro_dir=args.repro_dir,
        all_culprits=args.all_culprits,
        model_label=args.model,
    )


def _names_a_factory(spec: str) -> bool:
    location, colon, factory = spec.rpartition(":")
    return bool(colon and location and factory.isidentifier())
