"""Ops made from sizes or weights alone, found where the file computes them at run time.

Such an op's value is the same on any input, so it is never a row of the report
(:mod:`bisect_onnx.align.script_removed`), and the exporter folds most of them into
constants. Some it computes at run time from constants: Speech2Text's position ids (a
``CumSum`` over a mask of ones made from the input's size), BiT's standardized Conv
weights (a ``BatchNormalization`` over the weight). An error there showed first in the
data op reading the value, whose node was named the culprit though its own inputs had
never been checked. Each such op is looked for among its scope's nodes that no graph
input's values reach, in order, by the node its kind ends in and by shape and dtype;
PyTorch's value is kept by that node's output. The search checks the values inside a
failing segment against these (:mod:`bisect_onnx.search.inside_kernel`,
:mod:`bisect_onnx.search.alone`): a report's rows never hold them, so a node taken
wrongly here can only narrow a segment that fails already.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.script_reads import at_width, widened_integer
from bisect_onnx.align.script_table import END_OF

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
                        model: onnx.ModelProto | None,
                        nodes: Sequence[NodeInfo]) -> dict[str, CapturedValue]:
    """PyTorch's value of each op no input reaches by the ONNX value found to hold it.

    The ops made from sizes (``from_sizes``: names of ``capture``'s ops) and those
    made from weights alone (``capture.fixed_ops``), each group in graph order and
    looked for after the last node it took in the op's scope. ``scopes``: each scope's
    nodes in graph order; ``shapes``: every ONNX value's shape and dtype where known;
    ``nodes``: the graph's.
    """
    if model is None:
        return {}
    fed_by_inputs = _fed_by_inputs(model, nodes)
    values = {**capture.values, **capture.fixed_values}
    groups = ([op for op in capture.ops if op.name in from_sizes], capture.fixed_ops)
    found: dict[str, CapturedValue] = {}
    for ops in groups:
        cursor: dict[ScopeKey, int] = {}
        for op in ops:
            end = END_OF.get(op.kind.split("::", 1)[-1])
            key = calls.of(op.module, values[op.name])
            scope = scopes.get(key, ())
            wanted = values[op.name].array
            for position in range(cursor.get(key, 0), len(scope)):
                node = scope[position]
                if (end is None or node.op_type not in end.types or not node.outputs
                        or node.outputs[0] in fed_by_inputs or node.outputs[0] in found):
                    continue
                if _same_static(shapes.get(node.outputs[0]), wanted):
                    found[node.outputs[0]] = at_width(values[op.name],
                                                       shapes[node.outputs[0]][1])
                    cursor[key] = position + 1
                    break
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
