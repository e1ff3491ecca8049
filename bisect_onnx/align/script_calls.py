"""Which call of its module an op, and a TorchScript exporter's node, ran in.

Ops are paired with nodes in order, scope by scope. A module called more than once
has its calls' nodes in one scope, and the exporter may drop some of them (the
closing ``Transpose`` of one call and the opening one of the next cancel out), so
order alone would pair the first call's op with the second call's node. Where the
traced graph splits a module's ops into calls, the nodes are split too: by the
scope the exporter wrote, module by module up to the innermost one (``/blocks.0/``
and ``/blocks.2/blocks.0/`` for a module registered twice, ``act`` and ``act_1`` for
one called twice by its parent), numbered in order of appearance. Where the traced
graph does not split them, every call is one scope, as before.

The model's own ``forward`` starts from its inputs: each is paired with the ONNX graph
input holding it (:func:`held_inputs`), so that an op reading one is paired with a node
computed from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import NodeScope
from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["ScopeKey", "CallScopes", "Cursors", "held_inputs"]

#: (innermost module path, which call of it); ``""`` for the model's own forward.
ScopeKey = tuple[str, int]


class CallScopes:
    """The scope key of each op and of each node, decided once from both sides."""

    def __init__(self, capture: ScriptOpCapture, nodes: Sequence[NodeInfo],
                 scopes: Iterable[NodeScope | None]) -> None:
        self._capture = capture
        calls: dict[str, set[int]] = {}
        for op in capture.ops:
            calls.setdefault(op.module, set()).add(self._call(op))
        written: list[tuple[str, tuple[str, ...]] | None] = []
        seen: dict[str, list[tuple[str, ...]]] = {}
        for node, scope in zip(nodes, scopes, strict=True):
            if scope is None:
                written.append(None)
                continue
            module = scope.modules[-1] if scope.modules else ""
            # The scope as written, up to the innermost module: one per call of it.
            chain = tuple(node.name.split("/")[1:1 + len(scope.modules)])
            written.append((module, chain))
            if chain not in seen.setdefault(module, []):
                seen[module].append(chain)
        #: Modules whose ops the traced graph split into more than one call and whose
        #: nodes show as many; any other module's calls cannot be matched up: one scope.
        self.split = frozenset(module for module, numbers in calls.items()
                               if len(numbers) > 1 and len(seen.get(module, ())) == len(numbers))
        #: Each node's key, in graph order (``None`` where its scope is unknown).
        self.of_nodes: list[ScopeKey | None] = [
            None if entry is None else
            (entry[0], seen[entry[0]].index(entry[1]) if entry[0] in self.split else 0)
            for entry in written]

    def of_op(self, op: ScriptOp) -> ScopeKey:
        """The scope an op is paired in: its module, and its call where calls are split."""
        return self.of(op.module, self._capture.values[op.name])

    def of(self, module: str, value: CapturedValue) -> ScopeKey:
        """The scope of a value computed in ``module`` (its call read off its provenance)."""
        return (module, value.provenance.call if module in self.split else 0)

    def _call(self, op: ScriptOp) -> int:
        return self._capture.values[op.name].provenance.call


class Cursors(dict[ScopeKey, int]):
    """Per scope, the position after the last node an op was paired with.

    It never goes back: an op paired with a node before it (:meth:`order`) leaves it
    where it was.
    """

    def __setitem__(self, key: ScopeKey, position: int) -> None:
        super().__setitem__(key, max(position, self.get(key, 0)))

    def order(self, key: ScopeKey, scope: Sequence[NodeInfo],
              segments: Mapping[str, Sequence[NodeInfo]], sources: Sequence[str],
              ) -> Iterator[int]:
        """Positions of ``scope``'s nodes to look for the next op at, in order.

        After the previous op's node, then, for an op some of whose inputs were paired
        (``sources``), the nodes before it that no op's ``segments`` hold. Making in-place
        ops functional may put two independent ops of one call in another order than the
        exporter's: an ``LSTMCell``'s ``add_`` of its two Linears has the input's Linear
        moved before the state's, whose Gemm the exporter wrote first.
        """
        start = self.get(key, 0)
        yield from range(start, len(scope))
        if not sources:  # nothing ties the op to a node it would go back to
            return
        taken = {id(node) for segment in segments.values() for node in segment}
        yield from (position for position in range(min(start, len(scope)))
                    if id(scope[position]) not in taken)


def held_inputs(model: onnx.ModelProto | None, arrays: Mapping[str, np.ndarray]
                ) -> dict[str, str]:
    """The ONNX graph input holding each input of the traced graph (``input_0``, ...).

    One by one in order, where the graph has as many inputs, each of its array's dtype
    and rank, and of its size where the file fixes one (else none is paired). An op
    reading the model's input is then paired with a node computed from it: an
    ``LSTMCell``'s Linear of its input with the Gemm of the input, not with the Gemm of
    the zero state before it.
    """
    if model is None:
        return {}
    import onnx

    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    if len(inputs) != len(arrays):
        return {}
    held = {}
    for (name, array), value in zip(arrays.items(), inputs, strict=True):
        tensor = value.type.tensor_type
        dims = [dim.dim_value if dim.HasField("dim_value") else None
                for dim in tensor.shape.dim]
        if (not tensor.elem_type or np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
                tensor.elem_type)) != np.asarray(array).dtype
                or len(dims) != np.ndim(array)
                or any(dim not in (None, size) for dim, size in zip(dims, np.shape(array),
                                                                    strict=True))):
            return {}
        held[name] = value.name
    return held
