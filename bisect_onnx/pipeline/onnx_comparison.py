"""ONNX against ONNX: pair two graphs' values, judge each pair, decide.

One sample's captures in, its report and pairing out; also what production's probes
and the local checks need to judge a candidate value as its row was judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.onnx_pairs import (
    CandidateGroups,
    ValuePair,
    pair_graphs,
    pair_uncaptured,
)
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.compare import ArrayComparison
from bisect_onnx.judge.findings import AttributionFindings, ComparisonFindings
from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.judge.tolerance_judge import UNUSED_RULE
from bisect_onnx.judge.tolerances import (
    Tolerance,
    ToleranceRule,
    default_tolerance,
    precision_of,
)
from bisect_onnx.judge.value_judge import PairJudge
from bisect_onnx.judge.vocabulary import Granularity, ReportWarning
from bisect_onnx.pipeline.torch_comparison import decide_sample, vacuity_warnings
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.probes import Checkpoint

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.pipeline.onnx_sample import OnnxModels, OnnxSample

__all__ = ["Paired", "ProbePlan", "pair_judge", "compare_onnx_sample", "probe_checkpoints",
           "local_judge", "as_candidate_values", "kernel_references", "show_kernel_culprit"]


STRUCTURAL = ReportWarning(
    "structural-match",
    "the candidate's value names do not match the reference's (simplified, optimized "
    "offline or renamed): its values were matched by structure, each with a confidence "
    "(matched_by, match_confidence); check the match of the first divergence")



@dataclass
class Paired:
    """How one sample's values were paired and judged, beyond its report."""

    judge: PairJudge
    groups: CandidateGroups
    pairs: list[ValuePair]
    outputs: list[ValuePair]
    """The final outputs' pairs, by position."""
    unpaired_fused: list[str]
    """Reference values whose candidate value was not captured (fused away)."""
    nodes: dict[str, NodeInfo]
    reference: onnx.ModelProto
    """The reference graph (what it holds decides how a value pairs)."""
    _uncaptured: list[ValuePair] | None = field(default=None, init=False, repr=False)

    def uncaptured(self, reference_capture: Capture) -> list[ValuePair]:
        """Pairs for the candidate values the capture lacks (fused away), made once.

        Probes, kernel culprits and their rows all need them; only a divergence does.
        """
        if self._uncaptured is None:
            self._uncaptured = pair_uncaptured(self.reference, {
                name: reference_capture.values[name].array for name in self.unpaired_fused},
                self.groups)
        return self._uncaptured



def pair_judge(models: OnnxModels, candidate: Runner) -> tuple[PairJudge, str]:
    """How the two models' values are judged, and the precision its defaults follow.

    ``rtol``/``atol`` left ``None`` follow the narrower precision of the two models.
    """
    reference_precision = precision_of(models.reference.model)
    candidate_precision = precision_of(candidate.model)
    default, precision = default_tolerance(reference_precision, candidate_precision)
    base = Tolerance(default.rtol if models.rtol is None else models.rtol,
                     default.atol if models.atol is None else models.atol)
    return PairJudge(base, models.rules, scale_tolerance=models.atol is None,
                     converted=precision != "float32"
                     or candidate_precision != reference_precision), precision


def compare_onnx_sample(sample: OnnxSample) -> tuple[ComparisonFindings, Paired]:
    """Pair, compare and decide: the comparison's findings, and the pairing.

    The candidate's values are its capture's, with production's final outputs (the
    verdict is production's); ``rtol``/``atol`` left ``None`` follow the precision.
    """
    models, candidate, reference = sample.models, sample.candidate, sample.models.reference
    reference_capture, candidate_capture = sample.reference_capture, sample.run.judged_capture()
    rtol, atol, rules = models.rtol, models.atol, models.rules
    warnings = [sample.fell_back] if sample.fell_back else []
    judge, precision = pair_judge(models, candidate)
    base = judge.base
    groups = CandidateGroups(candidate.model, str(candidate.path.resolve().parent),
                             models.converted)
    graph_inputs = dict(zip((spec.name for spec in reference.inputs), sample.arrays,
                            strict=True))
    reference_arrays = {name: value.array for name, value in reference_capture.values.items()}
    candidate_arrays = {name: value.array for name, value in candidate_capture.values.items()}
    pairing = pair_graphs(reference.model, groups, reference_arrays, candidate_arrays,
                          graph_inputs=graph_inputs,
                          reference_dir=str(reference.path.resolve().parent),
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
    warnings.extend(_output_warnings(reference_capture, candidate_capture, final_outputs,
                                     rules, judge))
    decision = decide_sample(comparisons, final_outputs, candidate_capture, candidate)
    compared_nodes = {pair.node for pair in pairing.pairs if pair.node}
    findings = ComparisonFindings.decided(
        decision,
        rtol=base.rtol, atol=base.atol,
        final_outputs=final_outputs,
        comparisons=comparisons,
        coverage=Coverage(onnx_values=len(reference_capture.values),
                          aligned_values=len(pairing.pairs), torch_modules=0,
                          aligned_modules=0, onnx_nodes=len(candidate.nodes),
                          attributed_nodes=len(compared_nodes),
                          granularity=Granularity.VALUE),
        unaligned=pairing.unpaired,
        warnings=warnings,
        tolerance_basis=_tolerance_basis(precision, rtol, atol, rules),
    )
    fused = [item.name for item in pairing.unpaired if item.kind == "runtime-fused"]
    return findings, Paired(judge, groups, pairing.pairs, output_pairs, fused, nodes,
                           reference.model)



@dataclass
class ProbePlan:
    """What production's probes check, and how a probed value is judged and shown."""

    checkpoints: list[Checkpoint]
    """In graph order."""
    compare: Callable[[Checkpoint, np.ndarray], ArrayComparison]
    make_row: Callable[[str, CapturedValue], Record]
    pairs: list[ValuePair]
    """The pair behind each checkpoint."""


def _output_warnings(reference_capture: Capture, candidate_capture: Capture,
                     final_outputs: Sequence[Record], rules: Sequence[ToleranceRule],
                     judge: PairJudge) -> list[str]:
    """Outputs compared by position, rules that matched nothing, outputs too small to say."""
    warnings = []
    if len(reference_capture.outputs) != len(candidate_capture.outputs):
        warnings.append(f"the reference has {len(reference_capture.outputs)} outputs and the "
                        f"candidate {len(candidate_capture.outputs)}: the first "
                        f"{len(final_outputs)} were compared, by position")
    warnings.extend(UNUSED_RULE.format(where=rule.where, pattern=rule.pattern)
                    for rule in rules if rule not in judge.used)
    warnings.extend(vacuity_warnings(reference_capture.outputs, final_outputs,
                                     atol=judge.base.atol))
    return warnings


def probe_checkpoints(paired: Paired, candidate: Runner,
                      reference_capture: Capture) -> ProbePlan:
    """What production's probes check, and how a probed value is judged and shown.

    Checkpoints are the candidate's values paired with a reference value (those the
    capture lacks too, paired by name), each judged as its row is: converted as its
    pair says, with its own tolerance.
    """
    judge = paired.judge
    by_value: dict[str, ValuePair] = {}
    checkpoints = []
    uncaptured = paired.uncaptured(reference_capture)
    for pair in [*paired.pairs, *uncaptured]:
        node = candidate.view.producer_of(pair.candidate)
        reference = reference_capture.values[pair.reference]
        if node is None or pair.candidate in by_value or reference.array.dtype.kind not in "fc":
            continue
        by_value[pair.candidate] = pair
        checkpoints.append(Checkpoint(pair.candidate, reference, node))
    checkpoints.sort(key=lambda checkpoint: checkpoint.node.index)

    def compare(checkpoint: Checkpoint, array: np.ndarray) -> ArrayComparison:
        pair = by_value[checkpoint.name]
        return judge.compare(checkpoint.reference.array, array, pair, judge.tolerance(pair))[0]

    def make_row(name: str, probed: CapturedValue) -> Record:
        pair = by_value[name]
        return judge.record(0, reference_capture.values[pair.reference], probed, pair,
                            paired.nodes)

    return ProbePlan(checkpoints, compare, make_row, list(by_value.values()))



def local_judge(judge: PairJudge, pairs: Sequence[ValuePair],
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



def as_candidate_values(pairs: Sequence[ValuePair], reference_capture: Capture,
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


def kernel_references(paired: Paired, reference_capture: Capture) -> dict[str, CapturedValue]:
    """The reference's values of the candidate's fused-away values, by the candidate's names.

    ONNX Runtime fuses a MatMul into its bias Add, say: the candidate never shows the
    MatMul's output, but the reference model computes it, so the node that went wrong
    inside the kernel can be named. Integer and boolean values too (OpenVINO hands out
    no value of an integer chain it computes in i32: a BitShift planted there is named
    by the reference's value of its output), but not 8-bit integers: a quantized
    kernel's output (QLinearConv's) means another value under another scale.
    """
    uncaptured = paired.uncaptured(reference_capture)
    found: dict[str, CapturedValue] = {}
    for pair in uncaptured:
        reference = reference_capture.values.get(pair.reference)
        if (reference is None or pair.quantization is not None or pair.candidate in found
                or not _comparable_exactly(reference.array.dtype)):
            continue
        found[pair.candidate] = CapturedValue(pair.candidate, reference.array,
                                              reference.provenance)
    return found


def _comparable_exactly(dtype: np.dtype) -> bool:
    """Floats, booleans and integers wider than a byte (not a quantized value)."""
    return dtype.kind in "fcb" or (dtype.kind in "iu" and dtype.itemsize > 1)


def show_kernel_culprit(attribution: AttributionFindings, paired: Paired,
                        reference_capture: Capture,
                        local_values: Mapping[str, np.ndarray]) -> AttributionFindings:
    """A culprit found inside a fused kernel, shown as the comparison rows are.

    Attribution names it with the reference's value on the reference's side; the row
    says which reference node and module it stands for, with its pair's tolerance.
    """
    name = (attribution.evidence.get("inside_kernel") or {}).get("value")
    culprit = next((record for record in attribution.kernel_values
                    if record.onnx_value == name), None)
    if culprit is None or name not in local_values:
        return attribution
    uncaptured = paired.uncaptured(reference_capture)
    pair = next((pair for pair in uncaptured if pair.candidate == name), None)
    if pair is None or pair.reference not in reference_capture.values:
        return attribution
    local = CapturedValue(name, np.asarray(local_values[name]),
                          Provenance(position=culprit.index))
    row = paired.judge.record(culprit.index, reference_capture.values[pair.reference], local,
                              pair, paired.nodes)
    shown = replace(row, local=replace(row.local, introduced_here=True,
                                       max_abs_error=culprit.local.max_abs_error,
                                       status=culprit.local.status,
                                       nan_mismatch=culprit.local.nan_mismatch,
                                       classification=culprit.local.classification))
    return replace(attribution, kernel_values=tuple(
        shown if record is culprit else record for record in attribution.kernel_values))


def _tolerance_basis(precision: str, rtol: float | None, atol: float | None,
                     rules: Sequence[ToleranceRule]) -> str | None:
    parts = []
    if precision != "float32" and (rtol is None or atol is None):
        parts.append(f"{precision} defaults")
    if rules:
        parts.append(f"{len(rules)} per-value rule(s) from {rules[0].where.rsplit(':', 1)[0]}")
    return "; ".join(parts) or None
