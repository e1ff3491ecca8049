"""Pair the values of two ONNX graphs of one model: by name, through what converters insert.

Converters keep value names but add nodes around them:

* ``onnxruntime.transformers.float16.convert_float_to_float16`` computes in float16 and
  inserts ``Cast`` nodes at the graph's edges (``graph_input_cast_0``,
  ``graph_output_cast_0``, ``val_102_cast_to_fp32``): the value a graph output's name
  now holds is a Cast of the node that computed it.
* ONNX Runtime's QDQ quantization puts a ``QuantizeLinear``/``DequantizeLinear`` pair
  after each float tensor (``relu`` -> ``relu_QuantizeLinear_Output`` ->
  ``relu_DequantizeLinear_Output``), and may drop a Relu the quantization clamps
  anyway, so the DequantizeLinear output, the value every consumer reads, stands for
  the float tensor. Where ONNX Runtime fused the pair away (QLinearConv at level
  ``all``), the captured integer output of QuantizeLinear is dequantized here.

So each candidate value is traced up through float-to-float Casts and Q/DQ pairs to the
value that was computed (its *source*); a reference value pairs with the best captured
member of its namesake's source group, and the record names the node that computed it,
not an inserted Cast. Where the reference holds the same Q/DQ pairs (a QDQ model against
itself at another optimization level), every value pairs with its namesake instead.
When names do not survive (a graph simplified or optimized offline, every value
renamed), :mod:`bisect_onnx.align.structural` pairs them by structure. A name a rewrite
kept for another tensor is not compared with its namesake (:mod:`bisect_onnx.align.kept_names`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.kept_names import NAME_KEPT_FOR_OTHER_SHAPE, TAKEN_OVER, reshaped, taken_over
from bisect_onnx.align.modules import Unaligned
from bisect_onnx.align.quantization import Conversion, Quantization
from bisect_onnx.align.structural_match import Agree
from bisect_onnx.graph.weights import tensor_values

if TYPE_CHECKING:
    import onnx

__all__ = ["Quantization", "ValuePair", "Pairing", "CandidateGroups", "pair_graphs",
           "pair_uncaptured", "NAME_SHARE_FOR_STRUCTURE"]

logger = logging.getLogger(__name__)

#: Below this share of reference values found by name, the candidate is taken to be
#: renamed (simplified, optimized offline) and is matched by structure as well.
NAME_SHARE_FOR_STRUCTURE = 0.5

# TensorProto element types of floats: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
_FLOAT_TYPES = frozenset({1, 10, 11, 16})
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

NOT_IN_CANDIDATE = (
    "no value of this name in the candidate graph (fused, folded or renamed by the tool "
    "that made it)")
CANDIDATE_NOT_CAPTURED = (
    "its candidate value is not among the captured values (inside a kernel the runtime "
    "fused; --promote all captures it)")
NO_STRUCTURAL_MATCH = (
    "no value of the candidate graph is named so or matches it by structure (fused, "
    "folded or renamed beyond recognition)")


@dataclass(frozen=True)
class ValuePair:
    """A reference value and the candidate value that holds the same tensor."""

    reference: str
    candidate: str
    node: str | None
    """The candidate node that computed the value (not a Cast or Q/DQ node inserted
    after it); ``None`` for a value that is a graph input."""
    how: str
    """``name`` (same name), ``cast`` (through inserted Casts), ``qdq`` (the
    DequantizeLinear output of its QDQ pair), ``dequantized`` (its QuantizeLinear
    output, dequantized here), ``requantized`` (the float before its QDQ pair, put
    through the pair here: ONNX Runtime fused the pair away but kept the float), or a
    structural match's evidence (``topology``...)."""
    quantization: Quantization | None = None
    """The value's QDQ pair in the candidate, if it has one."""
    confidence: float | None = None
    """Structural matches only: how sure the match is (see :mod:`bisect_onnx.align.structural`)."""


@dataclass
class Pairing:
    """The pairs in reference order, and the reference values left without one."""

    pairs: list[ValuePair] = field(default_factory=list)
    unpaired: list[Unaligned] = field(default_factory=list)
    structural: bool = False
    """Whether the structural fallback was used (few names matched)."""


class CandidateGroups:
    """The candidate graph's values grouped by the value they were converted from."""

    def __init__(self, model: onnx.ModelProto, base_dir: str,
                 converted: Mapping[str, Conversion] | None = None) -> None:
        self.model = model
        self.base_dir = base_dir
        self.converted = dict(converted or {})
        """A recorded reference's values compared only once converted, by candidate name."""
        self.producers = {output: node for node in model.graph.node for output in node.output
                          if output}
        self.names = set(self.producers) | {info.name for info in model.graph.input}
        self.members: dict[str, list[str]] = defaultdict(list)
        for node in model.graph.node:
            for output in node.output:
                if output:
                    self.members[self.source(output)].append(output)

    def source(self, name: str) -> str:
        """The value ``name`` was cast or quantized from (itself when neither)."""
        seen = set()
        while name not in seen:
            seen.add(name)
            node = self.producers.get(name)
            if node is None:
                return name
            if node.op_type == "Cast" and _cast_target(node) in _FLOAT_TYPES:
                name = node.input[0]
            elif node.op_type == "QuantizeLinear":
                name = node.input[0]
            elif node.op_type == "DequantizeLinear" and self._op_of(node.input[0]) == (
                    "QuantizeLinear"):
                name = node.input[0]
            else:
                return name
        return name

    def computing_node(self, source: str) -> str | None:
        """The name of the node that computed ``source`` (``None`` for a graph input)."""
        node = self.producers.get(source)
        return (node.name or f"{node.op_type}({source})") if node is not None else None

    def quantization(self, name: str) -> Quantization | None:
        """The parameters of the Q/DQ pair ``name`` belongs to.

        Those of the QuantizeLinear or DequantizeLinear that computed ``name`` (with one
        pair per consumer, each has its own scale); for any other value, those of the
        first QuantizeLinear applied to its source. ``None`` when there is no pair, or
        its scale is not a constant.
        """
        node = self.producers.get(name)
        if node is None or node.op_type not in _QDQ_OPS:
            node = next((self.producers[member] for member in self.quantized(self.source(name))
                         if self.producers[member].op_type == "QuantizeLinear"), None)
        if node is None:
            return None
        scale = self._constant(node.input[1])
        if scale is None:
            return None
        zero = self._constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 1)
        return Quantization(scale, zero, axis)

    def quantized(self, source: str) -> list[str]:
        """The outputs of the Q/DQ pairs applied to ``source``, in graph order."""
        return [member for member in self.members.get(source, ())
                if self._op_of(member) in _QDQ_OPS]

    def _op_of(self, name: str) -> str | None:
        node = self.producers.get(name)
        return node.op_type if node is not None else None

    def _constant(self, name: str) -> np.ndarray | None:
        for tensor in self.model.graph.initializer:
            if tensor.name == name:
                return tensor_values(tensor, self.base_dir)
        node = self.producers.get(name)
        if node is not None and node.op_type == "Constant":
            from bisect_onnx.align.graph_description import constant_node_value

            return constant_node_value(node)
        return None


def pair_graphs(
    reference: onnx.ModelProto,
    groups: CandidateGroups,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    *,
    graph_inputs: Mapping[str, np.ndarray] | None = None,
    agree: Callable[[np.ndarray, np.ndarray], bool] | None = None,
    reference_dir: str = ".",
) -> Pairing:
    """Pair each captured reference value with a captured candidate value.

    Args:
        reference: The reference graph (its value names are the ones reported).
        groups: The candidate graph's values by source; neither model is modified.
        reference_values: The reference's captured values, in graph order.
        candidate_values: The candidate's captured values.
        graph_inputs: The inputs both ran on, by the reference's input names.
        agree: Whether a candidate and a reference array hold the same tensor; it
            breaks structural ties only (see :func:`bisect_onnx.align.structural.match_graphs`).
        reference_dir: The folder of the reference's file, where its external data lives.
    """
    candidate = groups.model
    pairing = Pairing()
    missing: list[str] = []
    reference_names = _value_names(reference)
    later = {theirs: mine for mine, theirs in taken_over(reference, candidate).items()}
    for name, array in reference_values.items():
        if name in later.values():  # its namesake holds a later value
            pairing.unpaired.append(Unaligned(name, TAKEN_OVER, "unmatched"))
            continue
        if name in later:  # absent from the candidate (taken_over)
            if later[name] not in candidate_values:
                pairing.unpaired.append(Unaligned(name, CANDIDATE_NOT_CAPTURED, "runtime-fused"))
            elif np.shape(candidate_values[later[name]]) != np.shape(array):
                missing.append(name)
            else:
                pairing.pairs.append(ValuePair(name, later[name], groups.computing_node(
                    later[name]), "taken over"))
            continue
        if name not in groups.names:
            missing.append(name)
            continue
        pair = _pair_by_name(name, np.asarray(array).dtype, groups, candidate_values,
                             reference_names)
        if pair is None:
            pairing.unpaired.append(Unaligned(name, CANDIDATE_NOT_CAPTURED, "runtime-fused"))
        elif reshaped(pair, array, candidate_values):
            # Another tensor under the same name: comparing it would claim a divergence.
            pairing.unpaired.append(Unaligned(name, NAME_KEPT_FOR_OTHER_SHAPE.format(
                candidate=list(np.shape(candidate_values[pair.candidate])),
                reference=list(np.shape(array))), "unmatched"))
        else:
            pairing.pairs.append(pair)
    found = len(reference_values) - len(missing)
    if missing and found < NAME_SHARE_FOR_STRUCTURE * len(reference_values):
        pairing.structural = True
        taken = {pair.candidate for pair in pairing.pairs}
        matched = _pair_by_structure(
            _CapturedGraph(reference, reference_values, reference_dir),
            _CapturedGraph(candidate, candidate_values, groups.base_dir), set(missing), taken,
            graph_inputs or {}, agree)
        pairing.pairs.extend(matched)
        missing = [name for name in missing if name not in {p.reference for p in matched}]
        logger.info("structural fallback: %d of %d renamed values paired", len(matched),
                    len(matched) + len(missing))
    reason = NO_STRUCTURAL_MATCH if pairing.structural else NOT_IN_CANDIDATE
    pairing.unpaired.extend(Unaligned(name, reason, "unmatched") for name in missing)
    order = {name: index for index, name in enumerate(reference_values)}
    pairing.pairs.sort(key=lambda pair: order[pair.reference])
    return pairing


def pair_uncaptured(reference: onnx.ModelProto, reference_values: Mapping[str, np.ndarray],
                    groups: CandidateGroups) -> list[ValuePair]:
    """Pairs, by name, for reference values whose candidate value was not captured.

    Any value of the candidate graph may stand in (one ONNX Runtime fused away can
    still be probed, :mod:`bisect_onnx.search.probes`); a float16 value's float32 Cast is
    not looked for, having no dtype to go by. ``reference_values`` are those values'
    arrays, by name, in the ``reference`` graph.
    """
    every: dict[str, None] = dict.fromkeys(groups.producers)
    reference_names = _value_names(reference)
    later = {theirs: mine for mine, theirs in taken_over(reference, groups.model).items()}
    pairs = (_pair_by_name(name, np.asarray(array).dtype, groups, every, reference_names)
             if name not in later else ValuePair(name, later[name], groups.computing_node(
                 later[name]), "taken over")
             for name, array in reference_values.items()
             if (name in groups.names or name in later) and name not in later.values())
    return [pair for pair in pairs if pair is not None]


def _value_names(model: onnx.ModelProto) -> frozenset[str]:
    """The names of a graph's inputs and node outputs."""
    return frozenset({info.name for info in model.graph.input}
                     | {output for node in model.graph.node for output in node.output if output})


def _pair_by_name(name: str, dtype: np.dtype, groups: CandidateGroups,
                  captured: Mapping[str, np.ndarray | None],
                  reference_names: Collection[str]) -> ValuePair | None:
    """The captured member of ``name``'s group that best stands for the reference value.

    ``dtype`` is the reference value's; ``reference_names`` every value name of the
    reference graph. ``None`` in ``captured``: a value present whose array is not at hand.
    """
    source = groups.source(name)
    members = groups.members.get(source, [])
    node = groups.computing_node(source)
    conversion = groups.converted.get(name)
    if conversion is not None:  # recorded as the comparison that converted it paired it
        return (ValuePair(name, name, node, conversion.how,
                          groups.quantization(conversion.quantized_as))
                if name in captured else None)
    quantized = groups.quantized(source)
    # A float reference whose namesake a converter put through Q/DQ pairs the reference
    # lacks (float against QDQ) stands for what the pairs' consumers read. Where the
    # reference holds the same pairs (a QDQ model against itself at another level) each
    # value pairs with its namesake: the float before a pair, its integers and its
    # DequantizeLinear output are three different tensors.
    if quantized and dtype.kind == "f" and not any(
            member in reference_names for member in quantized):
        # The DequantizeLinear output is what every consumer reads: the float tensor as
        # the quantized model has it (a Relu the clamping makes redundant may be gone).
        for how, op_type in (("qdq", "DequantizeLinear"), ("dequantized", "QuantizeLinear")):
            for member in quantized:
                if member in captured and groups.producers[member].op_type == op_type:
                    return ValuePair(name, member, node, how, groups.quantization(member))
        if source in captured:  # the float before the pair (a Relu it clamps may be gone)
            return ValuePair(name, source, node, "requantized", groups.quantization(source))
    if name in captured:
        how = "name" if name == source else "cast"
        return ValuePair(name, name, node, how, groups.quantization(name))
    producer = groups.producers.get(name)
    if producer is not None and producer.op_type == "DequantizeLinear" and (
            producer.input[0] in captured):
        # Its pair fused into a QLinear kernel: the integers it dequantizes stand in.
        return ValuePair(name, producer.input[0], node, "dequantized",
                         groups.quantization(name))
    if quantized:  # the pair's other members are other tensors
        return None
    # A Cast the converter inserted stands in; one the reference holds too is its own
    # value, paired with its namesake (an int64 shift's float Cast is another tensor).
    floats = [member for member in members if member in captured
              and member not in reference_names
              and np.asarray(captured[member]).dtype.kind == "f"]
    if floats:
        return ValuePair(name, floats[-1], node, "cast", groups.quantization(source))
    return None


@dataclass(frozen=True)
class _CapturedGraph:
    """One side of a structural match: its graph, and its values by its own names."""

    model: onnx.ModelProto
    values: Mapping[str, np.ndarray]
    folder: str
    """Where its external data lies: beside its own file, not in the working folder."""


def _pair_by_structure(reference: _CapturedGraph, candidate: _CapturedGraph, wanted: set[str],
                       taken: set[str], graph_inputs: Mapping[str, np.ndarray],
                       agree: Agree | None) -> list[ValuePair]:
    from bisect_onnx.align.graph_description import describe_model
    from bisect_onnx.align.structural import match_graphs

    inputs = list(graph_inputs.values())  # the same arrays on both sides
    reference_values, candidate_values = reference.values, candidate.values
    template = describe_model(reference.model, reference_values, base_dir=reference.folder,
                              graph_inputs=inputs)
    foreign = describe_model(candidate.model, candidate_values, base_dir=candidate.folder,
                             graph_inputs=inputs)
    producers = {output: node for node in candidate.model.graph.node
                 for output in node.output}
    pairs = []
    for match in match_graphs(template, foreign, agree=agree):
        if (match.template not in wanted or match.foreign in taken
                or match.foreign not in candidate_values):
            continue
        if np.shape(candidate_values[match.foreign]) != np.shape(
                reference_values[match.template]):
            continue
        node = producers.get(match.foreign)
        pairs.append(ValuePair(match.template, match.foreign,
                               (node.name or node.op_type) if node is not None else None,
                               match.how, confidence=match.confidence))
        wanted.discard(match.template)
        taken.add(match.foreign)
    return pairs


def _cast_target(node: onnx.NodeProto) -> int | None:
    return next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)
