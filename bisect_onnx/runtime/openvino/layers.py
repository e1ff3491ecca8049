"""What OpenVINO's CPU plugin executed: its layers, and the ONNX nodes fused into each.

``CompiledModel.get_runtime_model()`` lists the executed layers; each one's rt_info
says which original operations it holds (``originalLayersNames``, comma-separated),
its ``layerType`` and the precision it ran in (``runtimePrecision``,
``outputPrecisions``). OpenVINO names an operation after the ONNX node it was read
from, sometimes with a ``/suffix`` for a part it split the node into
(``node_Conv_138/WithoutBiases``), and names the last operation before a graph output
after that output's tensor: all three are mapped back to ONNX node names here. Other
names are operations OpenVINO made itself (``Multiply_4712``, a scale folded into a
FullyConnected): they are kept, with their numbers blanked, since they differ between
two compilations of one model while what they compute does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bisect_onnx.graph.view import GraphView

if TYPE_CHECKING:
    import openvino as ov

    from bisect_onnx.runtime.sides import JsonObject

__all__ = ["ExecutedLayer", "executed_layers", "blank_numbers",
           "BOOKKEEPING_LAYERS", "LAYOUT_OPS"]

#: Layers that hold or hand on data without computing it: their presence depends on
#: which values are outputs (a Reorder into an output's layout, an Output per result).
BOOKKEEPING_LAYERS = frozenset({"Input", "Parameter", "Const", "Output", "Result",
                                "Reorder"})
#: ONNX ops that only move data: OpenVINO moves a folded scale across them.
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class ExecutedLayer:
    """One layer OpenVINO executed, and the ONNX nodes it computes."""

    name: str
    layer_type: str
    runtime_precision: str
    output_precisions: str
    nodes: tuple[str, ...]
    """ONNX node names fused into the layer, in graph order."""
    own_operations: tuple[str, ...] = ()
    """Operations OpenVINO made itself, fused into the layer (numbers blanked)."""

    def signature(self) -> tuple:
        """What must be the same in production's compiled model and the capture's."""
        return (self.layer_type, self.runtime_precision, self.output_precisions,
                self.nodes, self.own_operations)

    @property
    def output_precision(self) -> str:
        """The precision of the layer's (first) output: what a captured value keeps."""
        return self.output_precisions.split(",")[0].strip()

    def to_dict(self) -> JsonObject:
        """The layer as the report writes it."""
        return {"name": self.name, "type": self.layer_type,
                "runtime_precision": self.runtime_precision,
                "output_precisions": self.output_precisions, "nodes": list(self.nodes)}


def blank_numbers(name: str) -> str:
    """An operation's name with its numbers blanked (they change between compilations)."""
    return _NUMBER.sub("#", name)


def executed_layers(compiled: ov.CompiledModel, index: GraphView) -> list[ExecutedLayer]:
    """The compiled model's computing layers, in execution order (bookkeeping left out).

    A node OpenVINO names only by a part it split off (``node_MatMul_3/transpose_b``,
    the weight's transpose) was computed elsewhere: in the layer that reads its
    outputs, when one layer does (the FullyConnected named after the bias Add fused
    into it). It is counted in that layer too, so that the layer a culprit ran in is
    the one that computed it, and its output is not taken for a value leaving a layer.
    """
    layers, whole, parts = [], set(), set()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer_type = info["layerType"].astype(str)
        if layer_type in BOOKKEEPING_LAYERS:
            continue
        nodes: set[str] = set()
        own: list[str] = []
        for name in info["originalLayersNames"].astype(str).split(","):
            if not name:
                continue
            node = index.onnx_node(name)
            if node is None:
                own.append(blank_numbers(name))
                continue
            nodes.add(node)
            (whole if node == name or name in index.producer else parts).add(node)
        layers.append(ExecutedLayer(
            name=op.get_friendly_name(), layer_type=layer_type,
            runtime_precision=info["runtimePrecision"].astype(str),
            output_precisions=info["outputPrecisions"].astype(str),
            nodes=tuple(sorted(nodes, key=index.order.__getitem__)),
            own_operations=tuple(sorted(own))))
    return _with_split_nodes(layers, index, parts - whole)


def _with_split_nodes(layers: list[ExecutedLayer], index: GraphView,
                      split: set[str]) -> list[ExecutedLayer]:
    """Each node named only by a split-off part, added to the one layer reading it."""
    holding = _holding(layers)
    added: dict[int, set[str]] = {}
    for node in split:
        readers = {reader for value in index.outputs.get(node, ())
                   for reader in index.consumers.get(value, ())}
        positions = {holding.get(reader) for reader in readers}
        if len(positions) == 1 and None not in positions:
            added.setdefault(positions.pop(), set()).add(node)
    return _adding(layers, index, added)


def _holding(layers: list[ExecutedLayer]) -> dict[str, int]:
    """ONNX node -> the position of the (last) layer holding it."""
    return {node: position for position, layer in enumerate(layers) for node in layer.nodes}


def _adding(layers: list[ExecutedLayer], index: GraphView,
            added: dict[int, set[str]]) -> list[ExecutedLayer]:
    """``layers`` with the nodes ``added`` at their positions, in graph order."""
    for position, nodes in added.items():
        layer = layers[position]
        layers[position] = replace(layer, nodes=tuple(sorted(
            {*layer.nodes, *nodes}, key=index.order.__getitem__)))
    return layers
