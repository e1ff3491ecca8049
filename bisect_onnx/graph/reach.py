"""Which values a graph's outputs are computed from.

A value that feeds no failing output cannot be why those outputs fail: a TopK's
indices nothing reads may differ where values tie, and the divergence is elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bisect_onnx.runtime.onnx_side import NodeInfo

__all__ = ["feeding"]

#: Nodes whose subgraphs may read any value of the outer graph, not only their inputs.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def feeding(nodes: Sequence[NodeInfo], outputs: Iterable[str]) -> frozenset[str] | None:
    """Every value ``outputs`` are computed from, themselves included.

    ``None`` where the graph has control flow: what its subgraphs read is not known here,
    so every value may feed the outputs.
    """
    if any(node.op_type in _CONTROL_FLOW for node in nodes):
        return None
    producers = {output: node for node in nodes for output in node.outputs}
    found: set[str] = set()
    stack = list(outputs)
    while stack:
        value = stack.pop()
        if value in found:
            continue
        found.add(value)
        producer = producers.get(value)
        if producer is not None:
            stack.extend(name for name in producer.inputs if name)
    return frozenset(found)
