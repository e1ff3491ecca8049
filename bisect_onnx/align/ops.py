"""Pair every FX op's value with the ONNX value of the same tensor (op level).

The dynamo exporter names an ONNX value after the FX node it computes, so most pairs
are found by name. The exporter's optimizer then renames and fuses: a value whose
name changed is found through node metadata (the FX node each ONNX node was made
from), and a value that no longer exists is explained rather than dropped:

- fused: BatchNorm folded into the Conv before it leaves no ONNX value for the
  Conv's own FX node; the fused node computes the BatchNorm's value (compared there)
  and the Conv is listed as *fused into* that node, with the optimizer's rule;
- removed: an op that returned its input unchanged (``clone``, a no-op ``view``)
  has no node of its own; its value is its input's, compared there;
- intermediates: an op made of several ONNX nodes (``aten.linear`` is MatMul then
  Add) has values torch never computed: listed as intermediates of that op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_onnx.align.modules import Pair, Unaligned
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import short_op
from bisect_onnx.graph.view import GraphView
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["OpAlignment", "align_ops"]


@dataclass
class OpAlignment:
    """FX values paired with ONNX values, and every value of either side left over."""

    pairs: list[Pair] = field(default_factory=list)
    onnx_only: list[Unaligned] = field(default_factory=list)
    """ONNX values with no torch value, each with the reason."""
    torch_only: list[Unaligned] = field(default_factory=list)
    """FX values with no ONNX value (fused, removed, folded), each with the reason."""
    fused_into: dict[str, str] = field(default_factory=dict)
    """FX node -> the ONNX node it was fused into."""
    segments: dict[str, list[NodeInfo]] = field(default_factory=dict)
    """FX node -> the ONNX nodes made from it, in graph order."""
    inferred: dict[str, str] = field(default_factory=dict)
    """ONNX node without metadata -> the FX node its output names say it was made from
    (the optimizer writes a ``Split`` of ``split``'s getitems as ``split_split_0``...)."""
    matches: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Structural fallback: ONNX value -> (confidence, how it was matched)."""
    fx_named_values: int = 0
    """Floating-point ONNX values that stand for an FX node's value."""
    fx_named_compared: int = 0


RUNTIME_FUSED = (
    "the runtime fused its node into a kernel with others (ONNX Runtime's optimized graph, "
    "OpenVINO's executed layers), so the value never exists in production; "
    "fusion-preserving capture leaves it out (--promote all shows it, at the price of "
    "running other kernels)"
)


def align_ops(
    capture: OpCapture,
    nodes: Sequence[NodeInfo],
    candidate_values: Mapping[str, CapturedValue],
) -> OpAlignment:
    """Pair each FX value with its ONNX value; explain every value left over."""
    alignment = OpAlignment()
    for node in nodes:
        made_from = node.torch.fx_node if node.torch else _named_after(node, capture)
        if made_from:
            alignment.segments.setdefault(made_from, []).append(node)
            if node.torch is None:
                alignment.inferred[node.name] = made_from
    producers = GraphView.of(nodes).producer_nodes
    pairing = _Pairing(capture, candidate_values, alignment)
    pairing.by_name(producers)
    pairing.by_getitem_order(nodes)
    pairing.by_segment_end()
    pairing.explain_leftovers(producers)
    alignment.pairs.sort(key=lambda item: item.candidate.provenance.position)
    return alignment


class _Pairing:
    """The pairs :func:`align_ops` has made so far, found in three passes, then the rest."""

    def __init__(self, capture: OpCapture, candidate_values: Mapping[str, CapturedValue],
                 alignment: OpAlignment) -> None:
        self.capture, self.candidate_values, self.alignment = capture, candidate_values, alignment
        self.paired_fx: dict[str, str] = {}  # FX node -> ONNX value
        self.paired_onnx: set[str] = set()

    def pair(self, fx_name: str, onnx_name: str) -> None:
        self.alignment.pairs.append(Pair(self.capture.values[fx_name],
                                         self.candidate_values[onnx_name]))
        self.paired_fx[fx_name] = onnx_name
        self.paired_onnx.add(onnx_name)

    def free_and_alike(self, output: str, fx_name: str) -> bool:
        """Whether the ONNX value is still unpaired and has the FX value's shape and dtype."""
        value = self.candidate_values.get(output)
        wanted = self.capture.values[fx_name].array
        return (value is not None and output not in self.paired_onnx
                and value.array.shape == wanted.shape and value.array.dtype == wanted.dtype)

    def by_name(self, producers: Mapping[str, NodeInfo]) -> None:
        """The exporter names a value after its FX node: pair namesakes of the same op."""
        for name, value in self.candidate_values.items():
            if name in self.capture.values and _same_op(self.capture, name, value,
                                                        producers.get(name)):
                self.pair(name, name)

    def by_getitem_order(self, nodes: Sequence[NodeInfo]) -> None:
        """A tuple-valued op rebuilt without metadata: its outputs are its getitems, in order."""
        for node in nodes:
            made_from = self.alignment.inferred.get(node.name)
            if made_from is None:
                continue
            for getitem, (source, index) in self.capture.getitems.items():
                if (source == made_from and index < len(node.outputs)
                        and getitem in self.capture.values and getitem not in self.paired_fx
                        and self.free_and_alike(node.outputs[index], getitem)):
                    self.pair(getitem, node.outputs[index])

    def by_segment_end(self) -> None:
        """Renamed by the optimizer: the last node made from the FX node holds its value."""
        for fx_name, segment in self.alignment.segments.items():
            if fx_name in self.paired_fx or fx_name not in self.capture.values:
                continue
            for output in segment[-1].outputs:
                if self.free_and_alike(output, fx_name):
                    self.pair(fx_name, output)
                    break

    def explain_leftovers(self, producers: Mapping[str, NodeInfo]) -> None:
        """Say why each unpaired value has no counterpart; count the values ops stand for."""
        capture, alignment = self.capture, self.alignment
        for fx_name in capture.values:
            if fx_name not in self.paired_fx:
                kind, reason = _why_no_onnx_value(fx_name, capture, alignment,
                                                  self.candidate_values)
                alignment.torch_only.append(Unaligned(fx_name, reason, kind))
        for name, value in self.candidate_values.items():
            producer = producers.get(name)
            fx_name = producer.torch.fx_node if producer and producer.torch else None
            stands_for_fx = fx_name is not None and (
                name == fx_name or self.paired_fx.get(fx_name) == name)
            if _is_float(value.array) and (stands_for_fx or name in capture.values):
                alignment.fx_named_values += 1
                alignment.fx_named_compared += name in self.paired_onnx
            if name not in self.paired_onnx:
                kind, reason = _why_no_torch_value(producer, capture, alignment, self.paired_fx)
                alignment.onnx_only.append(Unaligned(name, reason, kind))


def _named_after(node: NodeInfo, capture: OpCapture) -> str | None:
    """The FX op a node without metadata was made from, read from its output names.

    The exporter's optimizer names the outputs of a node it builds after the value it
    replaces (``split_split_0`` for ``split``); the longest FX name that prefixes every
    output (followed by ``_``) is taken, and none when there is no such name.
    """
    if not node.outputs:
        return None
    best = None
    for name in capture.op_names:
        if all(output.startswith(name + "_") for output in node.outputs) and (
                best is None or len(name) > len(best)):
            best = name
    return best


def _same_op(capture: OpCapture, name: str, value: CapturedValue,
             producer: NodeInfo | None) -> bool:
    """Whether an ONNX value named like an FX node really is that node's value.

    A program other than the one the exporter translated (a ``.pt2`` before the
    exporter's decompositions) can reuse a name for another op: shape, dtype and,
    where the node says, the op must agree.
    """
    wanted = capture.values[name].array
    if value.array.shape != wanted.shape or value.array.dtype != wanted.dtype:
        return False
    meta = producer.torch if producer is not None else None
    if meta is None or meta.fx_node is None:
        return True
    # The node may be made from the tuple-valued op this value is a getitem of.
    made_from = meta.fx_node
    if made_from != name and made_from not in capture.inputs_of.get(name, ()):
        return False
    return meta.torch_op is None or meta.torch_op == capture.op_names.get(made_from)


def _why_no_onnx_value(fx_name: str, capture: OpCapture, alignment: OpAlignment,
                       candidate_values: Mapping[str, CapturedValue]) -> tuple[str, str]:
    segment = alignment.segments.get(fx_name)
    if (segment and fx_name not in candidate_values
            and any(fx_name in node.outputs for node in segment)):
        return "runtime-fused", RUNTIME_FUSED
    if segment:
        names = ", ".join(node.name for node in segment[:3])
        return "layout", (f"its ONNX node(s) {names} produce no value of its shape and dtype "
                          "(changed layout or type)")
    fused = _fused_node(fx_name, capture, alignment)
    if fused is not None:
        alignment.fused_into[fx_name] = fused.name
        rule = fused.torch.rewrite_rule if fused.torch else None
        by = f" by the exporter's optimizer ({rule})" if rule else " by the exporter's optimizer"
        outputs = ", ".join(fused.outputs)
        return "fused", (f"fused into ONNX node {fused.name} ({fused.op_type}){by}, whose "
                         f"output {outputs} is compared with the op it ends in")
    source = _unchanged_input(fx_name, capture)
    if source is not None:
        return "removed", (f"returns its input {source} unchanged, so the exporter's "
                           f"optimizer removed it; compared at {source}")
    return "folded", ("no ONNX node computes it (folded into a constant or removed by the "
                      "exporter's optimizer)")


def _fused_node(fx_name: str, capture: OpCapture, alignment: OpAlignment) -> NodeInfo | None:
    """The rewritten ONNX node made from an op that reads ``fx_name``.

    Two steps at most: a tuple-valued op such as BatchNorm is read through a getitem.
    """
    frontier = list(capture.users_of.get(fx_name, ()))
    for _ in range(2):
        following = []
        for user in frontier:
            for node in alignment.segments.get(user, ()):
                if node.torch and node.torch.rewrite_rule:
                    return node
            following.extend(capture.users_of.get(user, ()))
        frontier = following
    return None


def _unchanged_input(fx_name: str, capture: OpCapture) -> str | None:
    """The input an op handed back with the same values (``clone``, a no-op ``view``)."""
    value = capture.values[fx_name].array
    for source in capture.inputs_of.get(fx_name, ()):
        held = capture.values.get(source)
        array = held.array if held is not None else capture.graph_inputs.get(source)
        if (array is not None and array.shape == value.shape and array.dtype == value.dtype
                and np.array_equal(array, value, equal_nan=True)):
            return source
    return None


def _why_no_torch_value(producer: NodeInfo | None, capture: OpCapture,
                        alignment: OpAlignment, paired_fx: Mapping[str, str]) -> tuple[str, str]:
    if producer is None:
        return "foreign", "not produced by a top-level node"
    fx_name = (producer.torch.fx_node if producer.torch
               else alignment.inferred.get(producer.name))
    if not fx_name:
        return "foreign", (f"node {producer.name} carries no torch metadata (added after "
                           "the export?)")
    op = short_op(capture.op_names.get(fx_name)
                  or (producer.torch.torch_op if producer.torch else None) or "an op")
    if fx_name in paired_fx:
        count = len(alignment.segments.get(fx_name, ()))
        return "intermediate", (f"an intermediate of {op} ({fx_name}), which is {count} ONNX "
                                f"nodes; compared at its output {paired_fx[fx_name]}")
    if fx_name in capture.values:
        return "intermediate", f"made from {op} ({fx_name}), whose value it does not hold"
    return "intermediate", (f"part of {op} ({fx_name}), which torch does not compute as one "
                            "tensor")


def _is_float(array: np.ndarray) -> bool:
    return array.dtype.kind in "fc"
