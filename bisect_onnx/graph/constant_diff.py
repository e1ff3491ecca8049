"""Where two exports of one model differ in what they hold as constants, node by node.

Two exports of the same model with the same exporter and options, made at two input
shapes, differ only where the export baked a shape in: a divisor traced as the
constant ``1``, a Reshape's shape ``[1, -1]``, an Expand's or a Range's size, a Slice's
end, a Python loop unrolled once per element of a dimension. :func:`graph_difference`
names those places: the nodes are paired by name (the TorchScript exporter's scoped
``/Div``, the dynamo exporter's FX-derived ``node_div``, both stable across shapes),
the rest by op type in graph order, and each pair's attributes and small constant
inputs (initializers and ``Constant`` outputs) are compared.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

__all__ = ["ConstantDifference", "CountDifference", "GraphDifference", "graph_difference",
           "format_constant"]

#: A shape, a size or a divisor holds a few numbers; a weight holds many, and two
#: exports of one model hold the same weights: larger constants are not compared.
_SMALL = 64


@dataclass(frozen=True)
class ConstantDifference:
    """One node whose attribute or constant input differs between the two exports."""

    node: str
    """The node's name in the first model (the file under test)."""
    op_type: str
    part: str
    """What differs: ``input 1`` (a constant input) or ``attribute 'ends'``."""
    first: str
    """Its value in the first model, as text (``1.0``, ``[1, -1]``)."""
    second: str
    """Its value in the second model (``computed`` where it is no constant there)."""
    values: tuple[float, ...] = ()
    """The first model's value, flattened, where it is numbers (empty where not)."""
    dims: tuple[int, ...] = ()
    """The first model's value's shape."""
    second_values: tuple[float, ...] = ()
    """The second model's value, flattened, where it is numbers (empty where not)."""
    feeds: tuple[str, ...] = ()
    """The op types the node's output reaches within a few nodes (an ``Equal`` and a
    ``Where`` that make an ``Expand``'s shape feed the ``Expand``)."""

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sizes the value may hold: its whole positive numbers and its dimensions."""
        whole = (int(value) for value in self.values if float(value).is_integer() and value > 0)
        return tuple(dict.fromkeys([*whole, *self.dims]))

    def size_pairs(self) -> dict[int, int]:
        """Second model's size -> first's, where the two values differ number by number.

        A Div by ``3.0`` in the first and ``5.0`` in the second says a size of 5 was 3.
        """
        if len(self.values) != len(self.second_values):
            return {}
        return {int(new): int(old) for old, new in zip(self.values, self.second_values,
                                                        strict=True)
                if old != new and float(old).is_integer() and float(new).is_integer()
                and old > 0 and new > 0}


@dataclass(frozen=True)
class CountDifference:
    """An op type the two exports hold a different number of (a loop unrolled)."""

    op_type: str
    first: int
    second: int


@dataclass(frozen=True)
class GraphDifference:
    """What differs between two exports of one model."""

    constants: tuple[ConstantDifference, ...] = ()
    counts: tuple[CountDifference, ...] = ()

    @property
    def empty(self) -> bool:
        """Whether the two exports hold the same constants and nodes."""
        return not self.constants and not self.counts


def graph_difference(first: onnx.ModelProto, second: onnx.ModelProto) -> GraphDifference:
    """The nodes of ``first`` whose constants differ from ``second``'s, and the op counts.

    ``Constant`` nodes are not named themselves: the node that reads one is, with the
    input it reads it as.
    """
    first_graph, second_graph = first.graph, second.graph
    constants_first, constants_second = _constants(first_graph), _constants(second_graph)
    differences = []
    for node, other in _paired(first_graph.node, second_graph.node):
        differences += _attribute_differences(node, other)
        differences += _input_differences(node, other, constants_first, constants_second)
    downstream = _downstream(first_graph)
    differences = [replace(each, feeds=downstream(each.node)) for each in differences]
    return GraphDifference(tuple(differences), _count_differences(first_graph, second_graph))


#: How far downstream the ops a baked value feeds are looked for.
_HOPS = 3


def _downstream(graph: onnx.GraphProto) -> Callable[[str], tuple[str, ...]]:
    """For a node's name, the op types its outputs reach within :data:`_HOPS` nodes."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    by_name = {node.name: node for node in graph.node}

    def reached(name: str) -> tuple[str, ...]:
        found: list[str] = []
        current = [by_name[name]] if name in by_name else []
        for _ in range(_HOPS):
            current = [reader for node in current for output in node.output
                       for reader in readers.get(output, ())]
            found += [node.op_type for node in current]
        return tuple(dict.fromkeys(found))

    return reached


def _paired(first: Sequence[onnx.NodeProto], second: Sequence[onnx.NodeProto]
            ) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """The nodes of both graphs paired, by name first, then by op type in graph order."""
    by_name = {node.name: node for node in second if node.name}
    pairs, left = [], []
    taken: set[int] = set()
    for node in first:
        if node.op_type == "Constant":
            continue
        other = by_name.get(node.name) if node.name else None
        if other is not None and other.op_type == node.op_type:
            pairs.append((node, other))
            taken.add(id(other))
        else:
            left.append(node)
    remaining: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for other in second:
        if other.op_type != "Constant" and id(other) not in taken:
            remaining[other.op_type].append(other)
    for node in left:
        if remaining[node.op_type]:
            pairs.append((node, remaining[node.op_type].pop(0)))
    return pairs


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Small initializers and ``Constant`` outputs, by value name."""
    from onnx import helper, numpy_helper

    found = {}
    for tensor in graph.initializer:
        if int(np.prod(tensor.dims, dtype=np.int64)) <= _SMALL and not tensor.external_data:
            found[tensor.name] = numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type != "Constant" or not node.output or len(node.attribute) != 1:
            continue
        value = helper.get_attribute_value(node.attribute[0])
        if node.attribute[0].name == "value":
            value = numpy_helper.to_array(value)
        array = np.asarray(value)
        if array.size <= _SMALL and array.dtype != object:
            found[node.output[0]] = array
    return found


def _attribute_differences(node: onnx.NodeProto, other: onnx.NodeProto
                           ) -> list[ConstantDifference]:
    from onnx import helper, numpy_helper

    def values(of: onnx.NodeProto) -> dict[str, object]:
        found = {}
        for attribute in of.attribute:
            if attribute.type in (attribute.GRAPH, attribute.GRAPHS):
                continue
            value = helper.get_attribute_value(attribute)
            if attribute.type == attribute.TENSOR:
                value = numpy_helper.to_array(value)
            found[attribute.name] = value
        return found

    mine, theirs = values(node), values(other)
    return [ConstantDifference(node.name, node.op_type, f"attribute {name!r}",
                               format_constant(value), format_constant(theirs.get(name)),
                               *_numbers(value), _numbers(theirs.get(name))[0])
            for name, value in mine.items() if not _same(value, theirs.get(name))]


def _input_differences(node: onnx.NodeProto, other: onnx.NodeProto,
                       mine: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]
                       ) -> list[ConstantDifference]:
    """The inputs that are constants in ``node``'s graph and differ from ``other``'s."""
    differences = []
    for index, (name, other_name) in enumerate(zip(node.input, other.input, strict=False)):
        value = mine.get(name)
        if value is None:
            continue
        other_value = theirs.get(other_name)
        if other_value is None or not _same(value, other_value):
            differences.append(ConstantDifference(
                node.name, node.op_type, f"input {index}", format_constant(value),
                "computed" if other_value is None else format_constant(other_value),
                *_numbers(value), _numbers(other_value)[0]))
    return differences


def _count_differences(first: onnx.GraphProto, second: onnx.GraphProto
                       ) -> tuple[CountDifference, ...]:
    mine = Counter(node.op_type for node in first.node if node.op_type != "Constant")
    theirs = Counter(node.op_type for node in second.node if node.op_type != "Constant")
    return tuple(CountDifference(op, mine[op], theirs[op])
                 for op in dict.fromkeys([*mine, *theirs]) if mine[op] != theirs[op])


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    return a == b


def _numbers(value: object) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """A constant's numbers, flattened, and its shape (nothing for text or a graph)."""
    array = np.asarray(value)
    if value is None or array.dtype.kind not in "iuf" or array.size > _SMALL:
        return (), ()
    return tuple(float(item) for item in array.reshape(-1)), tuple(array.shape)


def format_constant(value: object) -> str:
    """A constant as text: ``1.0``, ``[1, -1]``, ``b'x'`` (``absent`` for ``None``)."""
    if value is None:
        return "absent"
    if isinstance(value, np.ndarray):
        return repr(value.item()) if value.ndim == 0 else str(value.tolist())
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(list(value)) if isinstance(value, (list, tuple)) else repr(value)
