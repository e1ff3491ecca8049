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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import NodeScope
from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture

__all__ = ["ScopeKey", "CallScopes"]

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
        return (op.module, self._call(op) if op.module in self.split else 0)

    def _call(self, op: ScriptOp) -> int:
        return self._capture.values[op.name].provenance.call
