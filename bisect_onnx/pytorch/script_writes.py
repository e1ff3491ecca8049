"""Each value of a TorchScript graph as its op computed it, though a later op writes over it.

``remove_mutation`` makes in-place ops functional only where that is safe: an in-place
op on a view stays (an ``LSTMCell``'s ``sigmoid_`` on each chunk of its gates, the
``add_`` of the cell state onto the forget gate's product). The instrumented graph
returns its values when the run ends, so a value such an op wrote over later would be
read as it was then: the gates' sum as the activations made of it, the product as the
sum. Every value made before the graph's last write is therefore returned as a copy
taken right after its op: the value the op computed, which the exporter's node holds.
A graph with no write left returns its values as they are (no copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["as_computed"]


def as_computed(graph: torch.Graph, top_level: Sequence[torch.Node],
                made_at: Mapping[int, int], values: Sequence[torch.Value]) -> list[torch.Value]:
    """``values``, each made before the last write of ``top_level`` copied where it is made.

    ``made_at``: index into ``values`` -> position in ``top_level`` of the node making it.
    """
    last = max((position for position, node in enumerate(top_level) if _writes(node)),
               default=-1)
    if last < 0:
        return list(values)
    none = graph.insertConstant(None)
    none.node().moveBefore(top_level[0])
    kept = []
    for index, value in enumerate(values):
        position = made_at[index]
        if position >= last:
            kept.append(value)
            continue
        copy = graph.create("aten::clone", [value, none], 1)
        copy.output().setType(value.type())
        copy.insertAfter(value.node())
        kept.append(copy.output())
    return kept


def _writes(node: torch.Node) -> bool:
    """Whether ``node`` (or a node inside its blocks) writes into one of its arguments."""
    if any(_writes(inner) for block in node.blocks() for inner in block.nodes()):
        return True
    schema = node.schema()
    if "!" not in schema:  # no argument written (``Tensor(a!)``), or no schema at all
        return False
    import torch

    arguments = torch.parse_schema(schema).arguments
    return any(argument.alias_info is not None and argument.alias_info.is_write
               for argument in arguments)
