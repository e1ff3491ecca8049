"""How a value of one ONNX model is judged against another's: tolerance, conversion, SQNR.

Each pair gets its tolerance once (a rule from the user's file, a quantization step,
or the precision default), is compared in the wider of the two float types, and is
recorded with what a converted value needs (its dtype, its SQNR).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.align.onnx_pairs import ValuePair
from bisect_onnx.graph.nodes import NodeInfo, node_provenance
from bisect_onnx.judge.compare import ArrayComparison, compare_arrays
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import (
    Tolerance,
    ToleranceRule,
    judged_by,
    quantized_tolerance,
    rule_for,
)
from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["PairJudge", "signal_to_noise"]


class PairJudge:
    """Each pair's tolerance (file rule, quantization scale, precision default) and records."""

    def __init__(self, base: Tolerance, rules: Sequence[ToleranceRule], *,
                 scale_tolerance: bool, converted: bool) -> None:
        self.base = base
        self.rules = rules
        self.scale_tolerance = scale_tolerance
        self.converted = converted
        self.used: list[ToleranceRule] = []

    def tolerance(self, pair: ValuePair) -> Tolerance:
        """The pair's tolerance: the first matching rule, a quantization step, the base."""
        rule = rule_for(self.rules, pair.reference, pair.candidate)
        if rule is not None:
            if rule not in self.used:
                self.used.append(rule)
            return rule.tolerance
        if pair.quantization is not None and self.scale_tolerance:
            return quantized_tolerance(self.base, pair.quantization.step)
        return self.base

    def of(self, record: Record | None) -> Tolerance:
        """The tolerance ``record`` was judged by (a rule's, a quantization step's, the base)."""
        return judged_by(record, self.base)

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
        """The pair's table row, shown at the candidate node that computes it."""
        tolerance = self.tolerance(pair)
        result, sqnr = self.compare(reference.array, candidate.array, pair, tolerance)
        node = nodes.get(pair.node or "")
        shown = CapturedValue(candidate.name, candidate.array,
                              node_provenance(node, candidate.provenance.position)
                              if node is not None else candidate.provenance)
        record = make_record(index, Pair(reference, shown), result, final=final)
        origin = reference.provenance if reference.provenance.module is not None else (
            shown.provenance)
        return replace(record, torch_module=None if final else (origin.module or ""),
                       torch_op=origin.torch_op, source=origin.source,
                       candidate_dtype=str(candidate.array.dtype), match=replace(
            record.match, reference_value=reference.name, reference_node=reference.provenance.node,
            matched_by=pair.how if pair.confidence is not None else None,
            match_confidence=pair.confidence),
                       figures=replace(record.figures, sqnr_db=sqnr,
                                       rtol=None if tolerance == self.base else tolerance.rtol,
                                       atol=None if tolerance == self.base else tolerance.atol))


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
