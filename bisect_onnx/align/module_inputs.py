"""What enters a module call: the value its nodes read from outside it (module level).

A call's input row (``fc2 (input)``) is compared where the call's nodes read it, when
that is not already compared as another call's output holding the same array: what
remains are values computed between modules (a function call in a ``forward``, an
in-place view edit) or changed by a module without a node (a Dropout left in training
mode). A value is taken only where it is the one such value of the input's shape and
dtype; two exporter habits and one graph edit would otherwise give a wrong one. Where
several inputs of a call share a shape and dtype (a matmul's q and k, a block's unused
second input), the value must also hold the input's numbers.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["entering_pairs"]


def entering_pairs(
    entering: Mapping[Hashable, Sequence[CapturedValue]],
    groups: Mapping[Hashable, Sequence[NodeInfo]],
    candidate_values: Mapping[str, CapturedValue],
    held: dict[str, list[CapturedValue]],
    nodes: Sequence[NodeInfo],
) -> list[tuple[CapturedValue, CapturedValue]]:
    """(what enters a call, the ONNX value holding it), for each call's input located.

    Each recorded input takes the one value of its shape and dtype that the call's
    nodes read from outside the call (weights are no captured values, so they are
    not among them), and that is not computed from the call's own values (a node a
    graph tool inserted between two of the call's nodes is outside it). A pair whose
    ONNX value is already compared against the same array (``held``: the references
    each ONNX value is compared with, the previous call's output) adds nothing and is
    left out; an input that cannot be located is not listed: the call's output row
    stands for the call. ``held`` is extended with the pairs made.
    """
    pairs = []
    for key, values in entering.items():
        group = groups.get(key) or ()
        made_inside = _downstream(group, nodes)
        read = list(dict.fromkeys(name for node in group if node.op_type != "Shape"
                                  for name in node.inputs
                                  if name in candidate_values and name not in made_inside))
        for value in values:
            if (value.provenance.module_class or "").startswith("BatchNorm") and any(
                    node.op_type == "Conv" for node in group):
                continue  # dynamo: the folded Conv reads the Conv's input, not the norm's
            matches = [name for name in read
                       if candidate_values[name].array.shape == value.array.shape
                       and candidate_values[name].array.dtype == value.array.dtype
                       and not _transposed_alike(name, group, candidate_values)]
            if _alike(value, values) > 1:  # q and k of one shape: told apart by their values
                matches = _closest(value, matches, candidate_values)
            if len(matches) != 1 or any(_same_array(earlier.array, value.array)
                                        for earlier in held.get(matches[0], ())):
                continue
            pairs.append((value, candidate_values[matches[0]]))
            held.setdefault(matches[0], []).append(value)
    return pairs


def _alike(value: CapturedValue, values: Sequence[CapturedValue]) -> int:
    """How many of a call's inputs share ``value``'s shape and dtype (itself included)."""
    return sum(other.array.shape == value.array.shape and other.array.dtype == value.array.dtype
               for other in values)


#: How near an ONNX value must be to one of several inputs of one shape to be taken for
#: it: float32 rounding upstream, not another tensor (an unused input, the other
#: operand of a matmul).
_NEAR = 1e-3


def _closest(value: CapturedValue, matches: Sequence[str],
             candidate_values: Mapping[str, CapturedValue]) -> list[str]:
    """The one match whose values agree with ``value``'s, or none.

    A shape then no longer tells which read value a call's input is: where several of
    its inputs share it, the input is the value that holds its numbers (a module's
    unused input is read by none of its nodes, and must not take another's value).
    """
    reference = np.asarray(value.array, dtype=np.float64)
    scale = float(np.max(np.abs(reference), initial=0.0)) or 1.0
    near = [name for name in matches
            if np.allclose(np.asarray(candidate_values[name].array, dtype=np.float64),
                           reference, rtol=_NEAR, atol=_NEAR * scale, equal_nan=True)]
    return near if len(near) == 1 else []


def _transposed_alike(name: str, group: Sequence[NodeInfo],
                      candidate_values: Mapping[str, CapturedValue]) -> bool:
    """Whether the call reads ``name`` only through Transposes that may keep its shape.

    The exporter may give the call a transpose its parent did (``pool(x.transpose(1,
    2))``): what enters the call is then the transposed value, and with a square shape
    the value before the transpose would pass for it by shape alone. A Transpose whose
    output was not captured may keep the shape where two dimensions are equal.
    """
    shape = candidate_values[name].array.shape
    readers = [node for node in group if name in node.inputs]
    if not readers or any(node.op_type != "Transpose" or not node.outputs for node in readers):
        return False
    for node in readers:
        after = candidate_values.get(node.outputs[0])
        if after is not None and after.array.shape != shape:
            return False
        if after is None and len(set(shape)) == len(shape):
            return False  # distinct dimensions: no transpose keeps the shape
    return True


#: Nodes whose outputs are no data computed from the call's values (shapes, constants).
_NOT_DATA = frozenset({"Shape", "Size", "Constant"})


def _downstream(group: Sequence[NodeInfo], nodes: Sequence[NodeInfo]) -> set[str]:
    """Every value the group's nodes make, and every value computed from its data.

    Only up to the group's last node: what comes after it is read by none of them. A
    Shape the exporter scoped to the call (and its parent reads too) does not make
    what the parent computes from it the call's.
    """
    members = {node.index for node in group}
    made = {name for node in group for name in node.outputs}
    data = {name for node in group if node.op_type not in _NOT_DATA for name in node.outputs}
    last = max(members, default=-1)
    for node in nodes:  # in graph order, which ONNX makes topological
        if node.index <= last and node.index not in members and any(
                name in data for name in node.inputs):
            data.update(node.outputs)
    return made | data


def _same_array(first: np.ndarray, second: np.ndarray) -> bool:
    """The very copy, or equal values (NaN equal to NaN)."""
    if first is second:
        return True
    return first.shape == second.shape and np.array_equal(first, second, equal_nan=True)
