"""One graph view: a model's top-level nodes read once, with their order, producers and readers.

Made once per model by its runner (:attr:`bisect_onnx.runtime.runner.Runner.view`),
for the stages that ask which node computes or reads a value of the whole graph
(probes and their graph order, ONNX-against-ONNX checkpoints, the op naming,
OpenVINO's capture plan, which values feed a failing output). Maps over a subset of
nodes (one segment's, one translation's) are still built where they are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["GraphView"]


@dataclass(frozen=True)
class GraphView:
    """The ONNX graph's node order, producers and consumers, by name."""

    order: dict[str, int]
    """ONNX node name -> its index in the graph."""
    producer: dict[str, str]
    """Tensor name -> the ONNX node that produces it."""
    consumers: dict[str, list[str]] = field(default_factory=dict)
    """Tensor name -> the ONNX nodes that read it."""
    inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    op_types: dict[str, str] = field(default_factory=dict)
    """ONNX node name -> its op type."""
    producer_nodes: dict[str, NodeInfo] = field(default_factory=dict)
    """Tensor name -> the node that produces it (the last one, should two claim it)."""

    @classmethod
    def of(cls, nodes: Sequence[NodeInfo]) -> GraphView:
        """The view of ``nodes``, a graph's top-level nodes in order."""
        consumers: dict[str, list[str]] = {}
        for node in nodes:
            for name in node.inputs:
                consumers.setdefault(name, []).append(node.name)
        return cls(order={node.name: node.index for node in nodes},
                   producer={output: node.name for node in nodes for output in node.outputs
                             if output},
                   consumers=consumers,
                   inputs={node.name: tuple(name for name in node.inputs if name)
                           for node in nodes},
                   outputs={node.name: tuple(name for name in node.outputs if name)
                            for node in nodes},
                   op_types={node.name: node.op_type for node in nodes},
                   producer_nodes={output: node for node in nodes for output in node.outputs
                                   if output})

    def producer_of(self, value: str) -> NodeInfo | None:
        """The node that computes ``value``; ``None`` for a graph input or an initializer."""
        return self.producer_nodes.get(value)

    def position(self, value: str) -> int:
        """Where ``value`` is computed in graph order: its producer's index.

        A value no node computes (a graph input, an initializer) sorts after every node.
        """
        node = self.producer_nodes.get(value)
        return node.index if node is not None else len(self.order)

    def onnx_node(self, name: str) -> str | None:
        """The ONNX node a runtime's name for an operation stands for, if any.

        The node's own name, or a value it produces (a runtime names the operation
        before a graph output after that output), either with a ``/suffix`` for a part
        the runtime split it into.
        """
        for candidate in (name, name.split("/", 1)[0]):
            if candidate in self.order:
                return candidate
            if candidate in self.producer:
                return self.producer[candidate]
        return None
