"""What an ONNX node reads: the questions the TorchScript pairing asks of the graph.

Each takes ``producers`` (ONNX value -> the node that computes it) and answers from
the data flow alone: whether a node is computed from given values, which node of a
type reads a node next, what a node reads among its scope's nodes, and whether it
reads another only through a node the exporter did not make (one inserted there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo

if TYPE_CHECKING:
    from bisect_onnx.pytorch.script_ops import ScriptOp
    from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["alike", "at_width", "computes_from_constant", "could_hold", "descends", "extends",
           "reads_type", "reads_through_foreign", "reads_kinds", "follow", "tuple_end"]

Producers = Mapping[str, NodeInfo]
#: ONNX value -> (shape, with ``None`` for a dimension not known; dtype).
Shapes = Mapping[str, tuple[tuple[int | None, ...], np.dtype]]


def alike(shapes: Shapes, value: str, wanted: np.ndarray) -> bool:
    """Whether ``value`` is known to have ``wanted``'s dtype and shape.

    An ``int64`` op value is alike a narrower integer node's (:func:`widened_integer`).
    """
    known = shapes.get(value)
    if known is None:
        return False
    shape, dtype = known
    return ((dtype == wanted.dtype or widened_integer(wanted.dtype, dtype))
            and len(shape) == wanted.ndim
            and all(dim is None or dim == size for dim, size in zip(shape, wanted.shape,
                                                                   strict=True)))


def widened_integer(torch_dtype: np.dtype, onnx_dtype: np.dtype) -> bool:
    """Whether PyTorch's ``int64`` stands for the narrower integer an ONNX node computes.

    PyTorch widens integer sums to ``int64`` (``cumsum`` of an ``int32`` mask); the
    exporter's CumSum keeps the ``int32`` a later ``type_as`` casts back to
    (XLM-RoBERTa's position ids). Not the other way: a narrowing ``type_as`` is a Cast;
    and ``int32`` only, the width such a sum is taken in: an ``int64`` index is no
    ``uint8`` mask or ``int8`` quantized value of its shape.
    """
    return np.dtype(torch_dtype) == np.int64 and np.dtype(onnx_dtype) == np.int32


def at_width(value: CapturedValue, dtype: np.dtype) -> CapturedValue:
    """PyTorch's ``int64`` value at its node's narrower ``dtype`` where that loses nothing."""
    if not widened_integer(value.array.dtype, dtype):
        return value
    narrowed = value.array.astype(dtype)
    return replace(value, array=narrowed) if np.array_equal(narrowed, value.array) else value


def could_hold(shapes: Shapes, value: str, wanted: np.ndarray, sources: Sequence[str]) -> bool:
    """Alike, or of a shape nothing knows (not captured, not inferred) with inputs.

    A node of the op's type whose shape is unknown may be the op's: passing over it to
    a later node of a known shape would pair the op with another op's node (an
    attention's first ``view`` with its last). The op takes it, in order; its value
    was not captured, so the op is left unpaired, and the next op goes on after it.
    An op none of whose inputs is paired (``sources``, which the caller checks the
    node descends from) has nothing tying it to such a node: it passes over.
    """
    return alike(shapes, value, wanted) or (value not in shapes and bool(sources))


def extends(producers: Producers, shapes: Shapes, following: NodeInfo, node: NodeInfo,
            wanted: np.ndarray) -> bool:
    """Whether ``following`` reads ``node``'s value and, besides it, constants only."""
    others = [read for read in following.inputs if read not in node.outputs]
    constant = all(read not in producers or producers[read].op_type == "Constant"
                   for read in others)
    return (len(others) < len(following.inputs) and constant and bool(following.outputs)
            and could_hold(shapes, following.outputs[0], wanted, node.outputs))


def descends(producers: Producers, node: NodeInfo, sources: Sequence[str]) -> bool:
    """Whether every source value is read by ``node``, directly or not."""
    missing = set(sources)
    seen: set[str] = set()
    stack = list(node.inputs)
    while stack and missing:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        missing.discard(value)
        producer = producers.get(value)
        if producer is not None and value not in sources:
            stack.extend(producer.inputs)
    return not missing


def reads_type(producers: Producers, node: NodeInfo, op_type: str) -> bool:
    """Whether ``node`` reads the output of a node of type ``op_type``."""
    return any(getattr(producers.get(read), "op_type", None) == op_type for read in node.inputs)


def reads_through_foreign(producers: Producers, following: NodeInfo, node: NodeInfo) -> bool:
    """Whether ``following`` reads ``node``'s value only through an unscoped node."""
    return any(producer is not None and not producer.name.startswith("/")
               and set(producer.inputs) & set(node.outputs)
               for producer in map(producers.get, following.inputs))


def reads_kinds(producers: Producers, members: Collection[int], node: NodeInfo,
                needs: Counter[str], sources: Sequence[str]) -> bool:
    """Whether ``node`` reads nodes of these types, as many, directly or not.

    Only nodes of its scope count (``members``: their ``id``), and nothing before the
    ``sources``: the op's own nodes, as far as they can be told apart. A node with no
    scope (one the exporter did not make, inserted among the op's: a Mul after a
    GELU's Erf) counts for nothing, and what it reads is read on.
    """
    if not needs:
        return True
    found: Counter[str] = Counter()
    seen: set[int] = set()
    stack = [read for read in node.inputs if read not in sources]
    while stack:
        producer = producers.get(stack.pop())
        if producer is None or producer.index in seen or (
                id(producer) not in members and producer.name.startswith("/")):
            continue
        seen.add(producer.index)
        found[producer.op_type] += id(producer) in members
        stack += [read for read in producer.inputs if read not in sources]
    return not needs - found


def follow(producers: Producers, scope: Sequence[NodeInfo], position: int,
           kinds: Sequence[str]) -> int | tuple[NodeInfo, int] | None:
    """The position in ``scope`` of the last of ``kinds``, each reading the one before.

    From ``scope[position]`` on; ``None`` where one is missing, and (the node read, the
    position of the next one) where the next reads it only through a node the exporter
    did not make (one inserted there): the op's value is in neither.
    """
    for kind in kinds:
        node = scope[position]
        later = [(index, scope[index]) for index in range(position + 1, len(scope))
                 if scope[index].op_type == kind]
        following = next((index for index, item in later
                          if set(item.inputs) & set(node.outputs)), None)
        if following is None:
            foreign = next((index for index, item in later
                            if reads_through_foreign(producers, item, node)), None)
            return None if foreign is None else (node, foreign)
        position = following
    return position


def tuple_end(producers: Producers, shapes: Shapes, scope: Sequence[NodeInfo],
              end: tuple[str, int], held: Sequence[tuple[np.ndarray, int]],
              sources: Sequence[str]) -> int | None:
    """The position in ``scope`` of the node holding a tuple-valued op's outputs ``held``.

    ``end``: the node's type and how many of that type the op's translation makes before
    it; ``held``: (an output's value, the node's output holding it). The node must be
    computed from ``sources`` and hold each value. A multi-layer ``lstm`` makes a Squeeze
    per layer, each of its output's shape: its value is the last layer's, so the first
    node that could hold it is not the one. ``None``: no node of the scope holds them.
    """
    op_type, occurrence = end

    def holds(node: NodeInfo) -> bool:
        return (node.op_type == op_type and descends(producers, node, sources)
                and all(output < len(node.outputs) and alike(shapes, node.outputs[output], value)
                        for value, output in held))

    made = [position for position, node in enumerate(scope)
            if node.op_type == op_type and descends(producers, node, sources)]
    if occurrence < len(made) and holds(scope[made[occurrence]]):
        return made[occurrence]
    return next((position for position, node in enumerate(scope) if holds(node)), None)


def computes_from_constant(producers: Producers, scope: Sequence[NodeInfo], op: ScriptOp,
                           source: str) -> bool:
    """Whether a node of ``scope`` of ``op``'s type reads ``source`` and otherwise constants."""
    op_type = op.kind.split("::", 1)[-1].capitalize()
    return any(node.op_type == op_type and source in node.inputs and all(
        read == source or getattr(producers.get(read), "op_type", "Constant") == "Constant"
        for read in node.inputs) for node in scope)
