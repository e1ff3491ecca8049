"""Which values a graph's outputs are computed from.

A value that feeds no failing output cannot be why those outputs fail: a TopK's
indices nothing reads may differ where values tie, and the divergence is elsewhere.
Nor can one that reaches them only through values both sides computed bit for bit
alike: an OpenVINO BitwiseOr computed in 32 bits whose result a Where then discards.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from bisect_onnx.graph.view import GraphView
from bisect_onnx.graph.walk import subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["feeding"]


def feeding(view: GraphView, outputs: Iterable[str],
            model: onnx.ModelProto | None = None,
            settled: Collection[str] = ()) -> frozenset[str] | None:
    """Every value ``outputs`` are computed from, themselves included.

    The walk stops at ``settled`` values (included): values the run checked equal on
    both sides, bit for bit, through which no error upstream can travel.

    ``None`` where a node of ``model`` (the ONNX model ``view`` reads) holds a
    subgraph (If, Loop, com.microsoft's BeamSearch): what a subgraph reads of the outer
    graph is not followed here, so every value may feed the outputs.
    """
    if model is not None and any(next(subgraphs(attribute), None) is not None
                                 for node in model.graph.node for attribute in node.attribute):
        return None
    found: set[str] = set()
    stack = list(outputs)
    while stack:
        value = stack.pop()
        if value in found:
            continue
        found.add(value)
        producer = None if value in settled else view.producer_of(value)
        if producer is not None:
            stack.extend(name for name in producer.inputs if name)
    return frozenset(found)
