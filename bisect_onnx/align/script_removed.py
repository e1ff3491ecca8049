"""Traced ops the TorchScript pairing gives no node, told before any node is looked for.

An op whose value the input's values do not change: a trace fixes every size, so
``torch.zeros_like(key[:, 0]) - 1e38`` (RWKV's starting state) is the same whatever the
input, and the exporter folds it or computes it from shapes (a ``ConstantOfShape``);
``key[:, 0]``, read only for its size, is dropped or only its shape read. Looked for
like any op, each took the node of a later op of its kind (the loop's ``key[:, i]``),
and every op after it in its call was paired one node off: a clean file claimed 94
hidden divergences. Such ops are not compared.

A transpose the next one undoes: the exporter removes both (one call's closing
``transpose(1, 2)`` and the next call's opening one), and the two are the value the
first one read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.align.script_table import permutation

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture

__all__ = ["FROM_SIZE", "ShapeOnly", "undone_transpose"]

#: Ops whose value is made from their input's size (and constants) alone.
FROM_SIZE = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros",
                       "new_ones", "new_empty", "new_full"})
#: Ops whose value is a view of their first input: a write into it writes the input.
_VIEWS = frozenset({"slice", "select", "view", "narrow", "expand", "expand_as", "reshape",
                    "view_as", "unsqueeze", "squeeze", "transpose", "permute", "t",
                    "as_strided", "unflatten", "flatten", "diagonal", "alias", "detach",
                    "unfold", "split", "chunk", "unbind", "__getitem__"})


class ShapeOnly:
    """Which traced ops compute only from sizes, and which are read only for their size."""

    def __init__(self, capture: ScriptOpCapture) -> None:
        inputs_of, users_of = capture.inputs_of, capture.users_of
        written = _written(capture)
        self.constant: set[str] = set()
        for op in capture.ops:
            short, reads = op.kind.split("::", 1)[-1], inputs_of.get(op.name, ())
            if op.name not in written and (short in FROM_SIZE or (
                    reads and all(name in self.constant for name in reads))):
                self.constant.add(op.name)
        self.sized: set[str] = set()  # read only by constant ops: for their size alone
        for op in reversed(capture.ops):
            users = users_of.get(op.name, ())
            if op.name not in self.constant and users and all(
                    user in self.constant or user in self.sized for user in users):
                self.sized.add(op.name)

    def reason(self, name: str) -> str | None:
        """Why op ``name`` has no node in the export; ``None`` where it may have one."""
        if name in self.constant:
            return ("its value is made from sizes alone, which the trace fixes: the same "
                    "whatever the input (the exporter folds it, or computes it from shapes), "
                    "so it is not compared")
        if name in self.sized:
            return ("only ops made from sizes read it, for its size alone: the exporter "
                    "drops it or reads its shape, so it is not compared")
        return None


def _written(capture: ScriptOpCapture) -> set[str]:
    """The ops whose value an in-place op writes into, directly or through its views.

    ``h = zeros_like(x); h[:, 0] = x[:, 0]`` writes ``h`` through a ``select``: from
    then on ``h`` holds data, whatever it was made from.
    """
    kinds = {op.name: op.kind.split("::", 1)[-1] for op in capture.ops}
    written: set[str] = set()
    for op in capture.ops:
        kind = kinds[op.name]
        if not kind.endswith("_") or kind.startswith("_"):
            continue  # ``add_`` writes its first argument; ``_convolution`` is no write
        target = next(iter(capture.inputs_of.get(op.name, ())), None)
        while target is not None and target not in written:
            written.add(target)
            target = (next(iter(capture.inputs_of.get(target, ())), None)
                      if kinds.get(target) in _VIEWS else None)
    return written


def undone_transpose(op: ScriptOp, capture: ScriptOpCapture, by_name: Mapping[str, ScriptOp],
                     ends: Mapping[str, NodeInfo], onnx_of: Mapping[str, str]) -> str | None:
    """The ONNX value of what ``op`` returns, where it undoes the transpose it reads.

    ``by_name``: the capture's ops by name; ``ends``: the ops paired so far (by name);
    ``onnx_of``: the ONNX value of each.
    """
    reads = capture.inputs_of.get(op.name, ())
    inner = by_name.get(reads[0]) if len(reads) == 1 else None
    if inner is None or inner.name in ends or capture.users_of.get(inner.name) != (op.name,):
        return None
    before = capture.inputs_of.get(inner.name, ())
    rank = capture.values[op.name].array.ndim
    first, second = permutation(inner, rank), permutation(op, rank)
    if (first is None or second is None or len(before) != 1 or before[0] not in onnx_of
            or any(first[axis] != index for index, axis in enumerate(second))):
        return None
    return onnx_of[before[0]]
