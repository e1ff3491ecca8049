"""Which ONNX node holds a traced op's value, as the TorchScript exporter's record says.

The exporter's record of an op (:class:`~bisect_onnx.pytorch.script_exported.ExporterRecord`)
lists the nodes its symbolic function made and which reads which. The op's value is
the output of its last node; that node is found in the export as the end of a
:class:`Chain`: the node that reads the op's data (or its other nodes), then each
node that reads the one before and otherwise only constants, weights or sizes (the
trace's sizes are constants in the export, so is what is computed from them alone).
``aten::gelu`` is ``Mul`` then ``Mul`` after a ``Div``, ``Erf`` and ``Add``,
``aten::floor_divide`` a ``Div`` then two ``Cast``s. What else the first node reads,
directly or not, among the op's nodes (its ``ancestry``) tells it from another node
of its kind: the last ``MatMul`` of an attention reads its ``Softmax``.

An op whose record hands back one of its inputs made no node; one whose value the
export computes from constants alone has none either. Where there is no record (the
exporter cannot be asked, or refused the op alone), the hand table of
:mod:`bisect_onnx.align.script_table` decides, as it did before the record.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bisect_onnx.align.script_table import TUPLE_END_OF, OutputEnd
from bisect_onnx.pytorch.script_exported import ExporterRecord, Read

__all__ = ["Chain", "HandsBack", "chain_of", "output_ends"]

#: Nodes that are not ONNX ops: the exporter erases them (a list's items are read
#: directly), or that pass their input on (``Identity``).
_TRANSPARENT_PREFIX = "prim::"
_TRANSPARENT = frozenset({"Identity"})
#: Nodes whose value is a constant in an export of the sample's shapes.
_CONSTANT = frozenset({"Constant", "Shape", "prim::Constant"})


@dataclass(frozen=True)
class Chain:
    """The last nodes of an op's translation, as the pairing looks for them in the export."""

    kinds: tuple[str, ...]
    """The first node's type, then each following one's; the last holds the op's value."""
    ancestry: tuple[tuple[str, int], ...] = ()
    """(type, how many) of the op's other nodes the first one reads, directly or not."""

    @property
    def needs(self) -> Counter[str]:
        """:attr:`ancestry` as a multiset."""
        return Counter(dict(self.ancestry))


@dataclass(frozen=True)
class HandsBack:
    """The op's value is one of its inputs: the exporter made no node for it."""

    input: str | None
    """The data value handed back (an op's name, ``input_0``); ``None``: a weight or size."""


def chain_of(translation: ExporterRecord, output: int = 0) -> Chain | HandsBack | None:
    """How to find output ``output`` of the op in the export; ``None`` where nothing holds it.

    ``None``: the exporter computes the value from constants and sizes alone.
    """
    nodes, constant = translation.nodes, _constants(translation)
    held = _through_transparent(translation, translation.outputs[output])
    if held.node is None:
        data = translation.inputs[held.index] if 0 <= held.index < len(translation.inputs) else None
        return HandsBack(data)
    if constant[held.node]:
        return None
    chain = [held.node]
    while True:
        live = _live_reads(translation, constant, chain[0])
        if len(live) != 1 or live[0].node is None:
            break
        chain.insert(0, live[0].node)
    ancestry: Counter[str] = Counter()
    seen: set[int] = set()
    stack = [read.node for read in _live_reads(translation, constant, chain[0])
             if read.node is not None]
    while stack:
        position = stack.pop()
        if position in seen:
            continue
        seen.add(position)
        ancestry[nodes[position].kind] += 1
        stack += [read.node for read in _live_reads(translation, constant, position)
                  if read.node is not None]
    return Chain(tuple(nodes[position].kind for position in chain),
                 tuple(sorted(ancestry.items())))


def output_ends(translation: ExporterRecord | None, kind: str) -> tuple[OutputEnd, ...]:
    """For each output of a tuple-valued op, the node and its output that holds it.

    From the record where there is one and every output is one node's (TopK's values
    and indices); else from the hand table; ``()`` where neither says.
    """
    if translation is None:
        return TUPLE_END_OF.get(kind.split("::", 1)[-1], ())
    constant = _constants(translation)
    ends = []
    for output in translation.outputs:
        held = _through_transparent(translation, output)
        if held.node is None or constant[held.node]:
            return ()
        kind = translation.nodes[held.node].kind
        before = sum(node.kind == kind for node in translation.nodes[:held.node])
        ends.append(OutputEnd(kind, held.index, before))
    return tuple(ends)


def _constants(translation: ExporterRecord) -> list[bool]:
    """For each node, whether its value is a constant of the export.

    A Constant, a ``Shape`` (the trace's shapes are fixed), or a node reading only
    constants, weights and sizes: the exporter folds what they compute.
    """
    constant: list[bool] = []
    for node in translation.nodes:
        constant.append(node.kind in _CONSTANT or all(
            _is_constant(translation, constant, read) for read in node.reads))
    return constant


def _is_constant(translation: ExporterRecord, constant: list[bool], read: Read) -> bool:
    if read.node is not None:
        return constant[read.node]
    return not 0 <= read.index < len(translation.inputs) or translation.inputs[read.index] is None


def _live_reads(translation: ExporterRecord, constant: list[bool], position: int) -> list[Read]:
    """What node ``position`` reads that is data: the op's data inputs, its other nodes.

    Through a node the exporter erases or that passes its input on: a list's items.
    """
    found: list[Read] = []
    for read in translation.nodes[position].reads:
        if _is_constant(translation, constant, read):
            continue
        if read.node is not None and _transparent(translation.nodes[read.node].kind):
            found += _live_reads(translation, constant, read.node)
        else:
            found.append(read)
    return found


def _through_transparent(translation: ExporterRecord, read: Read) -> Read:
    """The value ``read`` stands for, past Identities (and erased nodes of one input)."""
    while (read.node is not None and _transparent(translation.nodes[read.node].kind)
           and len(translation.nodes[read.node].reads) == 1):
        read = translation.nodes[read.node].reads[0]
    return read


def _transparent(kind: str) -> bool:
    return kind in _TRANSPARENT or kind.startswith(_TRANSPARENT_PREFIX)
