"""The data path of an ONNX graph as a DAG of values, with what every path goes through.

A probe's pass says something only about the values it was computed from: on a graph
with branches (every residual block, every attention block) the values in
topological order are not a monotone sequence, and bisecting them as one names the
wrong node. What *is* monotone is the chain of values every path to a failing value
goes through (its dominators, from the graph inputs): if error enters at one node and
spreads only to what is computed from it, such a value passes only if the error
enters after it. :mod:`bisect_onnx.search.bisection` searches along that chain.

Only the data path counts: values computed from a graph input. Shape computations
(``Shape``, ``Size`` and what is computed from them and from constants alone) say
how big a tensor is, not what it holds, and are never on it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["ValueGraph", "SHAPE_OPS"]

#: Ops whose outputs describe their input's shape, not its values.
SHAPE_OPS = frozenset({"Shape", "Size"})

#: Stands for "before every graph input" in the dominator tree.
_ROOT = "\0graph inputs"


@dataclass
class ValueGraph:
    """Each data-path value's data-path parents, in topological order."""

    parents: dict[str, tuple[str, ...]]
    """Values on the data path -> the data-path values its node reads (graph inputs:
    none). Insertion order is topological."""
    order: dict[str, int] = field(init=False)
    """Each value's topological position."""
    _dominator: dict[str, str] = field(init=False, repr=False)
    _ancestors: dict[str, frozenset[str]] = field(init=False, repr=False,
                                                  default_factory=dict)

    def __post_init__(self) -> None:
        self.order = {name: index for index, name in enumerate(self.parents)}
        self._dominator = self._immediate_dominators()

    @classmethod
    def from_nodes(cls, nodes: Iterable[tuple[str, Sequence[str], Sequence[str]]],
                   graph_inputs: Iterable[str]) -> ValueGraph:
        """The data path of nodes given as ``(op_type, inputs, outputs)``.

        In any order: a graph edited by a tool need not list its nodes topologically
        (onnxruntime's float16 converter appends the input Casts last).
        """
        parents: dict[str, tuple[str, ...]] = {name: () for name in graph_inputs}
        for op_type, inputs, outputs in _topological(list(nodes)):
            if op_type in SHAPE_OPS:
                continue
            read = tuple(dict.fromkeys(name for name in inputs if name in parents))
            if not read:  # constants and shape arithmetic
                continue
            for output in outputs:
                if output and output not in parents:
                    parents[output] = read
        return cls(parents)

    def joined(self, name: str, parents: Sequence[str]) -> ValueGraph:
        """The graph with one more value, ``name``, computed from ``parents``.

        A stand-in for "any of these" (several failing outputs).
        """
        return ValueGraph({**self.parents, name: tuple(dict.fromkeys(parents))})

    def __contains__(self, name: object) -> bool:
        return name in self.parents

    def dominators(self, name: str) -> list[str]:
        """The values every path from the graph inputs to ``name`` goes through.

        First first; ``name`` itself is not included.
        """
        chain = []
        current = self._dominator[name]
        while current != _ROOT:
            chain.append(current)
            current = self._dominator[current]
        return chain[::-1]

    def ancestors(self, name: str) -> frozenset[str]:
        """``name`` and every data-path value it is computed from."""
        found = self._ancestors.get(name)
        if found is None:
            seen = {name}
            stack = [name]
            while stack:
                for parent in self.parents[stack.pop()]:
                    if parent not in seen:
                        seen.add(parent)
                        stack.append(parent)
            found = self._ancestors[name] = frozenset(seen)
        return found

    def _immediate_dominators(self) -> dict[str, str]:
        # One pass in topological order is exact on a DAG (Cooper, Harvey and
        # Kennedy's intersection, walking up from the later of two candidates).
        dominator: dict[str, str] = {}
        position = {**self.order, _ROOT: -1}

        def intersect(first: str, second: str) -> str:
            while first != second:
                if position[first] > position[second]:
                    first = dominator[first]
                else:
                    second = dominator[second]
            return first

        for name, read in self.parents.items():
            if not read:
                dominator[name] = _ROOT
                continue
            common = read[0]
            for parent in read[1:]:
                common = intersect(common, parent)
            dominator[name] = common
        return dominator


def _topological(nodes: list[tuple[str, Sequence[str], Sequence[str]]]) -> list:
    """The nodes in an order where each comes after the producers of its inputs.

    Kahn's algorithm, stable: nodes already in order keep it.
    """
    producer = {output: index for index, (_, _, outputs) in enumerate(nodes)
                for output in outputs if output}
    waiting_on = [{producer[name] for name in inputs if name in producer} - {index}
                  for index, (_, inputs, _) in enumerate(nodes)]
    readers: dict[int, list[int]] = {}
    for index, producers in enumerate(waiting_on):
        for source in producers:
            readers.setdefault(source, []).append(index)
    ready = [index for index, producers in enumerate(waiting_on) if not producers]
    heapq.heapify(ready)
    ordered = []
    while ready:
        index = heapq.heappop(ready)
        ordered.append(nodes[index])
        for reader in readers.get(index, ()):
            waiting_on[reader].discard(index)
            if not waiting_on[reader]:
                heapq.heappush(ready, reader)
    return ordered  # a node in a cycle (an invalid graph) is left out
