"""What the TorchScript exporter makes of each traced op, asked of the exporter itself.

The TorchScript exporter translates the traced graph node by node, each ATen node by
its op's symbolic function: ``aten::gelu`` becomes Div, Erf, Add, Mul, Mul (and the
Constants they read), ``aten::floor_divide`` Div, Cast, Cast. Here one traced node is
copied into a graph of its own, whose inputs have the traced values' types (a
weight's taken from the weight), and translated as the exporter translates it
(:func:`~bisect_onnx.pytorch.private_apis.torchscript_translator`). The ONNX nodes it
became, and which reads which, are the op's :class:`ExporterRecord`; the alignment reads
from it which node holds the op's value (:mod:`bisect_onnx.align.script_ends`).

Asked on first use, once per op and opset; ops whose graphs print the same (kind,
input types, literals) share one translation. Where the exporter cannot be asked (a
private API gone) or refuses the op, there is no translation and the alignment falls
back on its own table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

from bisect_onnx.errors import one_line
from bisect_onnx.pytorch.private_apis import (
    PrivateApiMissing,
    script_graph,
    torchscript_translator,
)

if TYPE_CHECKING:
    import torch

__all__ = ["Read", "ExportedNode", "ExporterRecord", "ExporterRecords", "InputSource"]

#: ``source(value)``: what a traced op's input is, (data name, weight); the data name
#: is ``None`` for an input that is no data value, the weight ``None`` for one that is
#: no tensor of the model.
InputSource: TypeAlias = "Callable[[torch.Value], tuple[str | None, torch.Tensor | None]]"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Read:
    """A value an exported node reads: another node's output, or one of the op's inputs."""

    node: int | None
    """The node's position in :attr:`ExporterRecord.nodes`; ``None`` for the op's input."""
    index: int
    """Which output of that node, or which input of the op (:attr:`ExporterRecord.inputs`)."""


@dataclass(frozen=True)
class ExportedNode:
    """One node the exporter made of the op: ``Mul``, ``Constant``, ``prim::ListConstruct``."""

    kind: str
    """The ONNX op type; a node of another domain keeps its whole kind (``prim::...``)."""
    reads: tuple[Read, ...]


@dataclass(frozen=True)
class ExporterRecord:
    """The exporter's record of one traced op: its nodes in order, and where its outputs are."""

    nodes: tuple[ExportedNode, ...]
    outputs: tuple[Read, ...]
    """For each output of the op, the node output holding it (or the input it hands back)."""
    inputs: tuple[str | None, ...] = ()
    """For each tensor the op reads: the data value it is (an op's name, ``input_0``), or
    ``None`` for a weight, or a size the trace computed (both constants in the export)."""

    @property
    def kinds(self) -> list[str]:
        """The ONNX op types made, in order, Constants left out."""
        return [node.kind for node in self.nodes if node.kind != "Constant"]


class ExporterRecords:
    """The traced node of each op, and what the exporter makes of it at an opset."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[torch.Node, InputSource]] = {}
        self._asked: dict[tuple[str, int], ExporterRecord | None] = {}
        self._translators: dict[int, Callable[[torch.Graph], torch.Graph]] = {}
        # By the printed graph of one op and opset: asked once per capture, since a
        # symbolic function the user registers later in the process must be seen.
        self._by_text: dict[tuple[str, int], ExporterRecord | None] = {}
        self._missing = False  # the exporter's private API is gone: said once, then none

    def add(self, name: str, node: torch.Node, source: InputSource) -> None:
        """Op ``name`` is traced ``node``; ``source(value)``: (data name, weight) of an input.

        The data name is ``None`` for an input that is no data value; the weight (a
        tensor, or ``None``) gives such an input its type.
        """
        self._nodes[name] = (node, source)

    def of(self, name: str, opset: int | None) -> ExporterRecord | None:
        """What the exporter makes of op ``name`` at ``opset``; ``None`` where it cannot say."""
        if opset is None or name not in self._nodes or self._missing:
            return None
        if (name, opset) not in self._asked:
            self._asked[name, opset] = self._ask(*self._nodes[name], opset)
        return self._asked[name, opset]

    def _ask(self, node: torch.Node, source: InputSource, opset: int) -> ExporterRecord | None:
        try:
            if opset not in self._translators:  # asked first: a missing API is said here
                self._translators[opset] = torchscript_translator(opset)
            graph, inputs = _alone(node, source)
            key = (graph.str(False), opset)  # the same op, input types and literals
            if key not in self._by_text:
                self._by_text[key] = self._translate(graph, opset)
        except PrivateApiMissing as error:
            self._missing = True
            logger.info("%s", error)
            return None
        except Exception as error:  # noqa: BLE001 - not copied alone: the table decides instead
            logger.debug("%s is not copied alone: %s", node.kind(), one_line(error))
            return None
        found = self._by_text[key]
        return None if found is None else replace(found, inputs=inputs)

    def _translate(self, graph: torch.Graph, opset: int) -> ExporterRecord | None:
        """The record of ``graph`` translated; ``None`` where the op's symbolic refused it."""
        try:
            return _record(self._translators[opset](graph))
        except Exception as error:  # noqa: BLE001 - any refusal: the table decides instead
            logger.debug("the exporter does not translate this alone: %s", one_line(error))
            return None


def _alone(node: torch.Node, source: InputSource) -> tuple[torch.Graph, tuple[str | None, ...]]:
    """A graph of ``node`` alone, and for each of its inputs the data value it stands for.

    Literals (and lists of them) are copied with it; every other value it reads is an
    input of the graph, with the traced type (a weight's from the weight itself).
    """
    graph = script_graph()
    copies: dict[int, torch.Value] = {}
    names: list[str | None] = []

    def copy(value: torch.Value) -> torch.Value:
        if value.unique() not in copies:
            producer = value.node()
            if producer.kind() in ("prim::Constant", "prim::ListConstruct"):
                for item in producer.inputs():
                    copy(item)
                made = graph.insertNode(graph.createClone(
                    producer, lambda item: copies[item.unique()]))
                copies[value.unique()] = made.output()
            else:
                name, weight = source(value)
                given = graph.addInput()
                if weight is not None:
                    given.inferTypeFrom(weight)
                else:
                    given.setType(value.type())
                names.append(name)
                copies[value.unique()] = given
        return copies[value.unique()]

    for value in node.inputs():
        copy(value)
    alone = graph.insertNode(graph.createClone(node, lambda value: copies[value.unique()]))
    for output in alone.outputs():
        graph.registerOutput(output)
    return graph, tuple(names)


#: A value read from outside the graph (none is, in a translated graph of one op).
_NOWHERE = Read(None, -1)


def _record(graph: torch.Graph) -> ExporterRecord:
    """The nodes of a translated graph, each reading the values it reads, and its outputs."""
    where = {value.unique(): Read(None, index) for index, value in enumerate(graph.inputs())}
    nodes = []
    for node in graph.nodes():
        reads = tuple(where.get(value.unique(), _NOWHERE) for value in node.inputs())
        for index, value in enumerate(node.outputs()):
            where[value.unique()] = Read(len(nodes), index)
        nodes.append(ExportedNode(node.kind().removeprefix("onnx::"), reads))
    return ExporterRecord(tuple(nodes), tuple(where.get(value.unique(), _NOWHERE)
                                           for value in graph.outputs()))
