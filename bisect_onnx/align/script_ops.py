"""Pair every traced ATen value with the TorchScript exporter's ONNX value of it (op level).

The TorchScript exporter names nodes after the module scope they ran in
(``/fc1/MatMul``, ``/Div`` for ``F.gelu`` in the model's own ``forward``) and records
no op names. Within one scope, though, it translates the traced ops in order, and each
op's value is held by the last node of its translation, which the exporter itself
says (:mod:`bisect_onnx.align.script_ends`): ``aten::linear`` ends in an ``Add`` after
its ``MatMul`` (or is one ``Gemm``), ``aten::gelu`` in the ``Mul`` after a ``Mul``.
So each op, in graph order, is paired with the next node of its scope that ends such
a chain, holds the op's shape and dtype, and reads (directly or not) the values the
op's inputs were paired with. Where the exporter cannot be asked, the hand table of
:mod:`bisect_onnx.align.script_table` names the end. Ops neither knows, and nodes no
guard accepts, are left unaligned with a reason rather than guessed.

An op with several outputs (``topk``'s values and indices) is one entry per output,
paired with the node output that holds it, where that node holds each by shape and dtype.
A BatchNorm the exporter folded into the Conv before it is paired with that node (the
convolution listed as fused into it); an ``x + 0`` the peephole pass removed, at ``x``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_onnx.align.modules import Pair, Unaligned
from bisect_onnx.align.ops import RUNTIME_FUSED, OpAlignment
from bisect_onnx.align.script_calls import CallScopes, Cursors, ScopeKey, held_inputs
from bisect_onnx.align.script_constants import constant_references
from bisect_onnx.align.script_ends import Chain, HandsBack, chain_of, output_ends
from bisect_onnx.align.script_reads import (
    at_width,
    computes_from_constant,
    could_hold,
    descends,
    extends,
    follow,
    reads_kinds,
    reads_through_foreign,
    reads_type,
    tuple_end,
)
from bisect_onnx.align.script_removed import ShapeOnly, undone_transpose
from bisect_onnx.align.script_table import (
    END_OF,
    LAYOUT,
    End,
    declined,
    identity_by_constant,
    passes_through,
    same_permutation,
)
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import read_scopes
from bisect_onnx.graph.value_shapes import value_shapes
from bisect_onnx.graph.view import GraphView
from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture
from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["align_script_ops"]

logger = logging.getLogger(__name__)


def align_script_ops(capture: ScriptOpCapture, nodes: Sequence[NodeInfo],
                     candidate_values: Mapping[str, CapturedValue],
                     model: Any = None) -> OpAlignment:
    """Pair each traced op with the exporter's node of it; explain every value left over.

    ``model`` (the ONNX model) gives the shapes of values the capture left out.
    """
    pairing = _ScopePairing(capture, nodes, candidate_values, model)
    ops = capture.ops
    for index, op in enumerate(ops):
        if op.outputs == 1:
            pairing.place(op)
        elif op.output == 0:  # a tuple-valued op: its outputs' entries follow it
            pairing.place_tuple(ops[index:index + op.outputs])
    capture.constant_references = constant_references(
        capture, pairing.shape_only.constant, pairing.in_scope, pairing.calls, pairing.shapes,
        model, nodes, pairing.onnx_of)
    return pairing.finish()


class _ScopePairing:
    """Ops placed on nodes so far, scope by scope, in graph order."""

    def __init__(self, capture: ScriptOpCapture, nodes: Sequence[NodeInfo],
                 candidate_values: Mapping[str, CapturedValue], model: Any) -> None:
        self.capture, self.nodes, self.candidate_values = capture, nodes, candidate_values
        self.shapes = value_shapes(model, candidate_values)
        self.model = model  # the ONNX model, for node attributes and its opset
        self.opset = None if model is None else next(  # the exporter's record is asked at it
            (item.version for item in model.opset_import if item.domain in ("", "ai.onnx")), None)
        self.producers = GraphView.of(nodes).producer_nodes
        self.calls = CallScopes(capture, nodes, read_scopes(nodes, capture.module_paths))
        self.in_scope: dict[ScopeKey, list[NodeInfo]] = {}
        for node, key in zip(nodes, self.calls.of_nodes, strict=True):
            if key is not None and node.op_type != "Constant":
                self.in_scope.setdefault(key, []).append(node)
        self.by_name = {op.name: op for op in capture.ops}
        self.cursor = Cursors()
        self.onnx_of = held_inputs(model, capture.graph_inputs)  # op or input -> ONNX value
        self.ends: dict[str, NodeInfo] = {}
        self.table_node: dict[str, NodeInfo] = {}  # op -> its chain's (table's) first node
        self.alignment = OpAlignment()
        self.shape_only = ShapeOnly(capture)

    def place(self, op: ScriptOp) -> None:
        """Find the node holding ``op``'s value, or say why there is none."""
        if (why := self.shape_only.reason(op.name)) is not None:
            return self._unaligned(op, "sizes", why)
        sources = self._sources(op)
        translation = self.capture.records.of(op.name, self.opset)
        rule = chain_of(translation, op.output) if translation is not None else None
        if translation is None and sources and passes_through(op):
            rule = HandsBack(next(name for name in self.capture.inputs_of[op.name]
                                  if name in self.onnx_of))
        if isinstance(rule, HandsBack):
            self._hands_back(op, rule)
            return
        undone = undone_transpose(op, self.capture, self.by_name, self.ends,
                                  self.onnx_of)
        if undone is not None:
            self.onnx_of[op.name] = undone
            self._unaligned(op, "removed", f"undoes the transpose before it, so the exporter "
                                           f"removed both; compared at {undone}")
            return
        if translation is not None and rule is None:
            self._unaligned(op, "folded", f"the exporter computes {op.kind} from constants "
                                          "and sizes alone: no node holds its value")
            return
        end = rule if rule is not None else END_OF.get(op.kind.split("::", 1)[-1])
        reason = declined(op, recorded=isinstance(end, Chain)) if end is not None else None
        if reason is not None:
            self._unaligned(op, "unmatched", reason)
            return
        if end is None:
            self._unaligned(op, "unmatched", f"the alignment knows no ONNX op that {op.kind} "
                                             "ends in, so it was not paired (not guessed)")
            return
        if identity_by_constant(op) and len(sources) == 1 and not computes_from_constant(
                self.producers, self.in_scope.get(self.calls.of_op(op), []), op, sources[0]):
            self.onnx_of[op.name] = sources[0]
            self._unaligned(op, "removed", "adds 0 or multiplies by 1, and TorchScript's "
                            f"peephole pass removed it; compared at {sources[0]}")
            return
        found = (self._find_chain(op, end, sources) if isinstance(end, Chain)
                 else self._find(op, end, sources))
        if isinstance(found, tuple):
            found, self.table_node[op.name] = found
        if isinstance(found, str):  # a foreign node cut the op's nodes short
            self._unaligned(op, "foreign", found)
            return
        if found is None and self._fold_batch_norm(op):
            return
        if found is None:
            scope = op.module or "the model's own forward"
            types = end.kinds[-1] if isinstance(end, Chain) else "/".join(sorted(end.types))
            self._unaligned(op, "folded", f"no {types} node of {scope} after the previous "
                                          "op holds a value of its shape and dtype computed "
                                          "from its inputs (folded into a constant or fused?)")
            return
        self._pair(op, found, 0, sources)

    def _hands_back(self, op: ScriptOp, rule: HandsBack) -> None:
        """``op`` returns its input unchanged: compared where that input is."""
        held = self.onnx_of.get(rule.input or "")
        if held is None:
            self._unaligned(op, "unmatched", "returns its input unchanged, so the exporter "
                            "made no node for it, and its input has no ONNX value either")
            return
        self.onnx_of[op.name] = held
        self._unaligned(op, "removed", "returns its input unchanged (eval mode, or a slice of "
                        f"everything), so the exporter made no node for it; compared at {held}")

    def place_tuple(self, ops: Sequence[ScriptOp]) -> None:
        """Find the node output holding each of a tuple-valued op's outputs, or say why not.

        ``ops`` has one entry per output, in order. Outputs held by one node type are one
        node's: it must hold a value of each one's shape and dtype at the output named
        (TopK's values at 0, its indices at 1), or none of them is paired.
        """
        first = ops[0]
        ends = output_ends(self.capture.records.of(first.name, self.opset), first.kind)
        if len(ends) != len(ops):
            for op in ops:
                self._unaligned(op, "unmatched", (
                    f"the alignment knows no ONNX node that output {op.output} of {op.kind} "
                    "ends in, so it was not paired (not guessed)"))
            return
        key = self.calls.of_op(first)
        sources, start = self._sources(first), self.cursor.get(key, 0)
        scope = self.in_scope.get(key, [])
        last = start - 1
        for op_type, occurrence in dict.fromkeys((end.type, end.occurrence) for end in ends):
            held = [(op, end.output) for op, end in zip(ops, ends, strict=True)
                    if (end.type, end.occurrence) == (op_type, occurrence)]
            arrays = [(self.capture.values[op.name].array, output) for op, output in held]
            position = tuple_end(self.producers, self.shapes, scope[start:], (op_type, occurrence),
                                 arrays, sources)
            position = None if position is None else start + position
            if position is None:
                scope_name = first.module or "the model's own forward"
                others = ", and its other outputs' at theirs," if len(held) > 1 else ""
                for op, output in held:
                    self._unaligned(op, "folded", (
                        f"no {op_type} node of {scope_name} after the previous op holds a "
                        f"value of its shape and dtype at output {output}{others} computed "
                        "from its inputs (folded into a constant or fused?)"))
                continue
            last = max(last, position)
            for op, output in held:
                self._pair(op, scope[position], output, sources)
        self.cursor[key] = last + 1

    def _sources(self, op: ScriptOp) -> list[str]:
        """The ONNX values holding what ``op`` reads (the ops paired, the model's inputs)."""
        return [self.onnx_of[name] for name in self.capture.inputs_of.get(op.name, ())
                if name in self.onnx_of]

    def _pair(self, op: ScriptOp, node: NodeInfo, output: int, sources: Sequence[str]) -> None:
        """``op``'s value is ``node``'s output ``output``; its segment, the nodes made for it.

        A second output of a node has none: the first output's segment holds the node.
        The segment reaches back to the values holding what the op reads. Where one has
        none (an op nothing places, or declined), nothing marks where the op's nodes
        begin: a segment holding that op's nodes would let a check of both stand for this
        op alone (a wrong culprit), so it is only the nodes of the op's chain (or the
        table's). A layout op merged into this op's nodes (a ``permute`` of the key into
        the attention's Transpose) is none such, where its own input marks a beginning.
        """
        self.ends[op.name] = node
        self.onnx_of[op.name] = node.outputs[output]
        self._at_node_width(op.name, node.outputs[output])
        bounded = all(map(self._bounds, self.capture.inputs_of.get(op.name, ())))
        self.alignment.segments[op.name] = self._segment(
            node, self.calls.of_op(op), sources,
            since=None if bounded else self.table_node.get(op.name, node))

    def _at_node_width(self, name: str, value: str) -> None:
        """PyTorch's ``int64`` at its node's width where lossless, in the capture from here on."""
        if (known := self.shapes.get(value)) is not None:
            self.capture.values[name] = at_width(self.capture.values[name], known[1])

    def _bounds(self, name: str) -> bool:
        """Whether a value an op reads marks where the op's nodes begin (see ``_pair``)."""
        op = self.by_name.get(name)
        return name in self.onnx_of or (
            op is not None and op.kind.split("::", 1)[-1] in LAYOUT
            and all(map(self._bounds, self.capture.inputs_of.get(name, ()))))

    def _find(self, op: ScriptOp, end: End, sources: Sequence[str],
              ) -> tuple[NodeInfo, NodeInfo] | str | None:
        """(the node holding ``op``'s value, the table's node it extends), why not, or None."""
        key = self.calls.of_op(op)
        scope = self.in_scope.get(key, [])
        wanted = self.capture.values[op.name].array
        for position in self.cursor.order(key, scope, self.alignment.segments, sources):
            node = scope[position]
            if not (node.op_type in end.types and node.outputs
                    and could_hold(self.shapes, node.outputs[0], wanted, sources)
                    and (end.reads is None or reads_type(self.producers, node, end.reads))
                    and self._same_permutation(op, node, wanted.ndim)
                    and descends(self.producers, node, sources)):
                continue
            first = node
            while (position + 1 < len(scope) and scope[position + 1].op_type in end.then
                   and extends(self.producers, self.shapes, scope[position + 1], node, wanted)):
                position += 1
                node = scope[position]
            self.cursor[key] = position + 1
            following = scope[position + 1] if position + 1 < len(scope) else None
            if following is not None and following.op_type in end.then and (
                    reads_through_foreign(self.producers, following, node)):
                self.cursor[key] = position + 2
                return (f"a node the exporter did not make reads {node.name}'s value, and "
                        f"{following.name}, which ends {op.kind}'s nodes, reads it: the op's "
                        "value is in neither")
            return node, first
        return None

    def _find_chain(self, op: ScriptOp, chain: Chain, sources: Sequence[str],
                    ) -> tuple[NodeInfo, NodeInfo] | str | None:
        """(the node holding ``op``'s value, its chain's first), why not, or None.

        The first node of the chain's kind after the previous op that reads the op's
        inputs and, among its scope's nodes, what the record says it reads; then each
        node of the chain read from the one before; the last must hold the op's value.
        """
        key = self.calls.of_op(op)
        scope = self.in_scope.get(key, [])
        members = {id(node) for node in scope}
        wanted = self.capture.values[op.name].array
        # A node reading another op's value that this op does not read is that op's
        # reader: remove_mutation may move ``0 + x`` after the ops of a later ``+=``.
        others = set(self.onnx_of.values()).difference(sources)
        for position in self.cursor.order(key, scope, self.alignment.segments, sources):
            first = scope[position]
            if (first.op_type != chain.kinds[0] or not descends(self.producers, first, sources)
                    or not reads_kinds(self.producers, members, first, chain.needs, sources)
                    or others.intersection(first.inputs)):
                continue
            last = follow(self.producers, scope, position, chain.kinds[1:])
            if isinstance(last, tuple):  # cut short by a node inserted there
                read, reader = last
                self.cursor[key] = reader + 1
                return (f"a node the exporter did not make reads {read.name}'s value, and "
                        f"{scope[reader].name}, which ends {op.kind}'s nodes, reads it: the "
                        "op's value is in neither")
            if last is None:
                continue
            node = scope[last]
            if (node.outputs and could_hold(self.shapes, node.outputs[0], wanted, sources)
                    and self._same_permutation(op, node, wanted.ndim)):
                self.cursor[key] = last + 1
                return node, first
        return None

    def _same_permutation(self, op: ScriptOp, node: NodeInfo, rank: int) -> bool:
        return (node.op_type != "Transpose" or self.model is None
                or same_permutation(op, self.model.graph.node[node.index], rank))

    def _segment(self, end: NodeInfo, scope: ScopeKey, sources: Sequence[str],
                 since: NodeInfo | None = None) -> list[NodeInfo]:
        """The nodes of ``scope`` between the op's input values and its end, in graph order.

        ``since``: no node before this one (in graph order) is taken.
        """
        members = {id(node) for node in self.in_scope.get(scope, [])
                   if since is None or node.index >= since.index}
        taken = {id(node) for segment in self.alignment.segments.values() for node in segment}
        found: dict[int, NodeInfo] = {}
        stack = [end]
        while stack:
            node = stack.pop()
            if node.index in found or id(node) not in members or id(node) in taken:
                continue
            found[node.index] = node
            stack.extend(self.producers[read] for read in node.inputs
                         if read in self.producers and read not in sources)
        return [found[index] for index in sorted(found)]

    def _unaligned(self, op: ScriptOp, kind: str, reason: str) -> None:
        self.alignment.torch_only.append(Unaligned(op.name, reason, kind))

    def _fold_batch_norm(self, op: ScriptOp) -> bool:
        """A BatchNorm with no node of its own is the Conv's node it was folded into."""
        sources = self.capture.inputs_of.get(op.name, ())
        conv = self.ends.get(sources[0]) if sources else None
        if op.kind != "aten::batch_norm" or conv is None or conv.op_type != "Conv":
            return False
        del self.ends[sources[0]]
        self.ends[op.name] = conv
        self.onnx_of[op.name] = conv.outputs[0]
        self.alignment.segments[op.name] = self.alignment.segments.pop(sources[0])
        self.alignment.fused_into[sources[0]] = conv.name
        self.alignment.torch_only.append(Unaligned(sources[0], (
            f"the exporter folded the BatchNorm after it into ONNX node {conv.name}, whose "
            f"output is compared with the BatchNorm ({op.name})"), "fused"))
        return True

    def finish(self) -> OpAlignment:
        """Pairs where the end's value was captured; every other value explained."""
        alignment, paired = self.alignment, set()
        for name in self.ends:
            value = self.onnx_of[name]
            captured = self.candidate_values.get(value)
            if captured is None:
                self._unaligned(self.by_name[name], "runtime-fused",
                                RUNTIME_FUSED)
                continue
            alignment.pairs.append(Pair(self.capture.values[name], captured))
            paired.add(value)
            alignment.fx_named_values += captured.array.dtype.kind in "fc"
            alignment.fx_named_compared += captured.array.dtype.kind in "fc"
        segment_of = {node.index: name for name, segment in alignment.segments.items()
                      for node in segment}
        for value in self.candidate_values:
            if value in paired:
                continue
            producer = self.producers.get(value)
            owner = segment_of.get(producer.index) if producer is not None else None
            if owner is not None:
                reason = (f"an intermediate of {self.capture.op_names[owner]} ({owner}); "
                          f"compared at its output {self.onnx_of[owner]}")
                alignment.onnx_only.append(Unaligned(value, reason, "intermediate"))
            else:
                alignment.onnx_only.append(Unaligned(value, (
                    "no traced op was paired with the node that computes it"), "unmatched"))
        alignment.pairs.sort(key=lambda pair: pair.candidate.provenance.position)
        logger.info("paired %d of %d traced ops with ONNX values", len(alignment.pairs),
                    len(self.capture.ops))
        return alignment
