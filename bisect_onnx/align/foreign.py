"""Op-level alignment for ONNX files of unknown origin, through an export made here.

A file renamed by onnxsim or another tool, or built elsewhere, has neither the
exporter's metadata nor FX names. The model is exported here with the dynamo exporter
(the *template*, whose value names are FX node names and whose torch values are
known), and the user's graph is matched to the template by structure
(:mod:`bisect_onnx.align.structural`): op type, shape, dtype, topology and initializer
content, with run-time values breaking ties only upstream of any disagreement. Each
pair keeps the match's confidence; ambiguous and unmatched values are listed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair, Unaligned
from bisect_onnx.align.ops import OpAlignment
from bisect_onnx.align.structural_match import StructuralMatch
from bisect_onnx.judge.compare import Status, compare_arrays
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import onnx

__all__ = ["align_foreign"]

logger = logging.getLogger(__name__)


def align_foreign(
    template: onnx.ModelProto,
    ops: OpCapture,
    foreign: onnx.ModelProto,
    foreign_dir: Path,
    candidate_values: Mapping[str, CapturedValue],
    graph_inputs: Mapping[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
) -> OpAlignment:
    """Pair the foreign graph's values with torch op values through the template.

    ``alignment.matches`` holds each paired foreign value's confidence and how it was
    matched (``topology``, ``region``, ``values``, ``position``...).
    """
    from bisect_onnx.align.graph_description import describe_model
    from bisect_onnx.align.structural import match_graphs

    inputs = list(graph_inputs.values())  # the same arrays on both sides
    template_description = describe_model(
        template, {name: value.array for name, value in ops.values.items()},
        graph_inputs=inputs)
    foreign_description = describe_model(
        foreign, {name: value.array for name, value in candidate_values.items()},
        base_dir=str(foreign_dir), graph_inputs=inputs)

    def agree(foreign_array: np.ndarray, template_array: np.ndarray) -> bool:
        return compare_arrays(template_array, foreign_array, rtol=rtol,
                              atol=atol).status == Status.PASS

    matches = match_graphs(template_description, foreign_description, agree=agree)
    alignment = _alignment_from(matches, ops, candidate_values)
    logger.info("structural fallback: %d of %d foreign values paired", len(alignment.pairs),
                len(candidate_values))
    return alignment


def _alignment_from(matches: Sequence[StructuralMatch], ops: OpCapture,
                    candidate_values: Mapping[str, CapturedValue]) -> OpAlignment:
    """Pairs where a match names a torch value of the same shape; the rest, with reasons."""
    alignment = OpAlignment()
    for match in matches:  # a node is attributed when any of its values was matched
        value = candidate_values.get(match.foreign)
        if match.template is not None and value is not None and value.provenance.node:
            alignment.inferred.setdefault(value.provenance.node, match.template)
    paired_fx: set[str] = set()
    for match in matches:
        if match.foreign not in candidate_values:
            continue  # a graph input
        value = candidate_values[match.foreign]
        is_float = value.array.dtype.kind in "fc"
        # No names to go by: every floating-point value of the file counts as one an op
        # stands for, so the figure says how much of the file was matched and compared.
        alignment.fx_named_values += is_float
        if match.template is not None and match.template in ops.values:
            reference = ops.values[match.template]
            if reference.array.shape == value.array.shape:
                alignment.pairs.append(Pair(reference, value))
                paired_fx.add(match.template)
                alignment.matches[match.foreign] = (match.confidence, match.how)
                alignment.fx_named_compared += is_float
                continue
        alignment.onnx_only.append(_unpaired(match))
    for name in ops.values:
        if name not in paired_fx:
            alignment.torch_only.append(Unaligned(
                name, "no value of the given graph matches it by structure (fused, folded "
                "or renamed beyond recognition)", "unmatched"))
    alignment.pairs.sort(key=lambda pair: pair.candidate.provenance.position)
    return alignment


def _unpaired(match: StructuralMatch) -> Unaligned:
    if match.how == "ambiguous":
        shown = ", ".join(match.alternatives[:4])
        return Unaligned(match.foreign, f"ambiguous: fits {shown} equally well by structure, "
                         "and values cannot tell them apart", "ambiguous")
    if match.template is not None:
        return Unaligned(match.foreign, f"matches template value {match.template}, which is "
                         "an intermediate of a multi-node op (no torch value)", "intermediate")
    return Unaligned(match.foreign, "no value of the export made here fits it (a fused or "
                     "added node)", "foreign")
