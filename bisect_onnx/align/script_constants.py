"""Ops made from sizes or weights alone, found where the file computes them at run time.

Such an op's value is the same on any input, so it is never a row of the report
(:mod:`bisect_onnx.align.script_removed`), and the exporter folds most of them into
constants. Some it computes at run time from constants: Speech2Text's position ids (a
``CumSum`` over a mask of ones made from the input's size), BiT's standardized Conv
weights (a ``BatchNormalization`` over the weight). An error there showed first in the
data op reading the value, whose node was named the culprit though its own inputs had
never been checked. Each such op is looked for among its scope's nodes that no graph
input's values reach, in trace order, by the node its kind ends in, by its very shape and
dtype, and by what it reads: the nodes of the op's inputs found so far, and for an input
the exporter folded, a constant of that input's shape and dtype; and no value another op
was found to hold (T5's bucket arithmetic has many ops of one kind, some folded: a
folded ``.to(long)`` took the next Cast, ``0 + mask * 16`` the Add of that constant and
the ``where``, and the wrong ids they were credited with made the embedding's Gather
fail alone).
PyTorch's value is kept by that node's output. The search checks the values inside a
failing segment against these (:mod:`bisect_onnx.search.inside_kernel`,
:mod:`bisect_onnx.search.alone`): a report's rows never hold them, so a node taken
wrongly here can only narrow a segment that fails already.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.script_reads import at_width, descends, widened_integer
from bisect_onnx.align.script_removed import FROM_SIZE
from bisect_onnx.align.script_table import END_OF
from bisect_onnx.graph.view import GraphView

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.align.script_calls import CallScopes, ScopeKey
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.pytorch.script_ops import ScriptOpCapture
    from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["constant_references"]

#: Nodes whose output is the input's shape, not its values: what they compute from is
#: the same on any input of the traced sizes.
_SIZE_READERS = frozenset({"Shape", "Size"})


def constant_references(capture: ScriptOpCapture, from_sizes: Collection[str],
                        scopes: Mapping[ScopeKey, Sequence[NodeInfo]], calls: CallScopes,
                        shapes: Mapping[str, tuple[tuple[int | None, ...], np.dtype]],
                        model: onnx.ModelProto | None, nodes: Sequence[NodeInfo],
                        held: Mapping[str, str]) -> dict[str, CapturedValue]:
    """PyTorch's value of each op no input reaches by the ONNX value found to hold it.

    The ops made from sizes (``from_sizes``: names of ``capture``'s ops) and those
    made from weights alone (``capture.fixed_ops``), in trace order, each looked for
    after the last node taken in its scope. ``scopes``: each scope's nodes in graph
    order; ``shapes``: every ONNX value's shape and dtype where known; ``nodes``: the
    graph's; ``held``: the ONNX value of each op and graph input the rows paired.
    """
    if model is None:
        return {}
    values = {**capture.values, **capture.fixed_values}
    ops = sorted([op for op in capture.ops if op.name in from_sizes] + capture.fixed_ops,
                 # A fixed op comes before the data op recorded next (its position).
                 key=lambda op: (values[op.name].provenance.position,
                                 op.name not in capture.fixed_values))
    constants = _Constants(model)
    producers = GraphView.of(nodes).producer_nodes
    fed_by_inputs = _fed_by_inputs(model, nodes)
    onnx_of = dict(held)
    found: dict[str, CapturedValue] = {}
    cursor: dict[ScopeKey, int] = {}
    for op in ops:
        end = END_OF.get(op.kind.split("::", 1)[-1])
        reads = () if op.kind.split("::", 1)[-1] in FROM_SIZE else capture.inputs_of.get(
            op.name, ())
        if end is None or "" in reads or any(read not in values and read not in onnx_of
                                             for read in reads):
            continue  # an input whose value is not known cannot be checked
        key = calls.of(op.module, values[op.name])
        scope = scopes.get(key, ())
        wanted = values[op.name].array
        own = [onnx_of[read] for read in reads if read in onnx_of]
        # A node reading another op's value is that op's reader (T5's ``0 + mask * 16``,
        # folded into a constant, would take the Add of that constant and the ``where``).
        others = set(onnx_of.values()).difference(own)
        for position in range(cursor.get(key, 0), len(scope)):
            node = scope[position]
            if (node.op_type not in end.types or not node.outputs
                    or node.outputs[0] in fed_by_inputs or node.outputs[0] in found
                    or not _same_static(shapes.get(node.outputs[0]), wanted)
                    or others.intersection(node.inputs) or not descends(producers, node, own)
                    or not all(constants.read_by(node, values[read].array)
                               for read in reads if read not in onnx_of)):
                continue
            found[node.outputs[0]] = at_width(values[op.name], shapes[node.outputs[0]][1])
            onnx_of[op.name] = node.outputs[0]
            cursor[key] = position + 1
            break
        else:  # no node: one that hands its input on (a ``type_as`` to the type it has)
            same = [read for read in reads if read in onnx_of and read in values
                    and np.array_equal(values[read].array, wanted)]
            if len(same) == 1 and values[same[0]].array.shape == wanted.shape:
                onnx_of[op.name] = onnx_of[same[0]]
    return found


def _same_static(known: tuple[tuple[int | None, ...], np.dtype] | None,
                 wanted: np.ndarray) -> bool:
    """Whether a node's value is known to have ``wanted``'s very shape, and its dtype.

    A dimension shape inference could not tell matches nothing here: where the
    exporter folded such an op, it would take the next node of its kind (the
    ``permute`` before Data2VecVision's ``Resize``, folded, took the Transpose after it,
    and a plant after them was named as their segment).
    """
    if known is None:
        return False
    shape, dtype = known
    return (shape == wanted.shape
            and (dtype == wanted.dtype or widened_integer(wanted.dtype, dtype)))


def _fed_by_inputs(model: onnx.ModelProto, nodes: Sequence[NodeInfo]) -> set[str]:
    """The values the graph inputs' values reach (not through a node reading a shape)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    reached = {value.name for value in model.graph.input if value.name not in initializers}
    for node in nodes:  # in graph order
        if node.op_type not in _SIZE_READERS and reached.intersection(node.inputs):
            reached.update(node.outputs)
    return reached


class _Constants:
    """The shape and dtype of each of the file's constants (initializers, ``Constant`` nodes)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx.helper import tensor_dtype_to_np_dtype

        tensors = {tensor.name: tensor for tensor in model.graph.initializer}
        for node in model.graph.node:
            value = next((attribute.t for attribute in node.attribute
                          if attribute.name == "value"), None)
            if node.op_type == "Constant" and node.output and value is not None:
                tensors[node.output[0]] = value
        self._kinds: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for name, tensor in tensors.items():
            try:
                dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.data_type))
            except (KeyError, TypeError, ValueError):  # a type numpy has no name for
                continue
            self._kinds[name] = (tuple(tensor.dims), dtype)

    def read_by(self, node: NodeInfo, wanted: np.ndarray) -> bool:
        """Whether ``node`` reads a constant of ``wanted``'s shape and dtype.

        Where the exporter folded an op, its reader reads its value as a constant; the
        value itself is not asked for, since a weight planted there (or another
        checkpoint's) is what the check is to find.
        """
        return any(_same_static(self._kinds.get(name), wanted) for name in node.inputs)
