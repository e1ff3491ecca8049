"""Walking an ONNX graph's contents: the tensors it holds and the graphs nested in it.

Loader, weight copying, repro writing and local checks all need every tensor of a
model (initializers, sparse ones, node attributes, If/Loop bodies); they share these
walkers so that none of them forgets a place a tensor can hide.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["graph_tensors", "subgraphs"]


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph holds: weights and node attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for subgraph in subgraphs(attribute):
                yield from graph_tensors(subgraph)


def subgraphs(attribute: onnx.AttributeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node attribute holds (an If's branches, a Loop's body)."""
    if attribute.HasField("g"):
        yield attribute.g
    yield from attribute.graphs
