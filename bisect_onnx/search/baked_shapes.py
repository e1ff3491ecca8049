"""A shape the export baked in: what the check found, and how the report says it.

The check (:mod:`bisect_onnx.pipeline.baked_check`) exports the model again at the
run's shapes with the export's own call; where that export reaches parity and its
graph differs from the file's only in some constants, those constants are the shapes
the file was exported at, baked in. :class:`BakedShapes` holds what it found; its
warning, classification and advice are the report's words for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.graph.constant_diff import CountDifference
from bisect_onnx.judge.vocabulary import ReportWarning
from bisect_onnx.report.formatting import format_number
from bisect_onnx.runtime.sides import JsonObject

if TYPE_CHECKING:
    from bisect_onnx.graph.provenance import SourceLocation
    from bisect_onnx.pytorch.reexport import ExportCall, TracerNote

__all__ = ["BAKED_SHAPE", "BAKED_KIND", "NO_BUG", "BakedNode", "BakedShapes", "symbolic_hint",
           "input_shapes_differ"]

#: The culprit classification of a divergence the export's baked shapes explain.
BAKED_KIND = "baked shape"

#: How the advice on a baked shape ends: the model's code, not a tool, is to change.
NO_BUG = "; no bug to file"

BAKED_SHAPE = ReportWarning(
    "baked-shape",
    "the export baked {shapes} into the graph: {nodes}; "
    "checked: the model exported here at this run's shapes with the same call ({call}) "
    "reaches parity (max abs {error}){notes}")

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class BakedNode:
    """A node of the file whose constant differs from the export at the run's shapes."""

    node: str
    op_type: str
    part: str
    """``input 1`` or ``attribute 'ends'``."""
    in_file: str
    at_run: str
    """The value in the export made at the run's shapes (``computed`` if none)."""
    module: str | None = None
    """The module path around it (``""``: the model's own forward; ``None``: unknown)."""
    source: SourceLocation | None = None
    note: TracerNote | None = None
    """The tracer's warning at that line, where the export made here gave one."""
    values: tuple[float, ...] = ()
    """The file's value, flattened, where it is numbers."""
    feeds: tuple[str, ...] = ()
    """The op types its output reaches within a few nodes."""

    def describe(self) -> str:
        """``node '/Div' (Div) input 1 is 2.0 (4.0 at this run's shapes) in ... at f.py:7``."""
        module = ("" if self.module is None else " in the model's own forward"
                  if self.module == "" else f" in module {self.module}")
        source = f" at {self.source}" if self.source is not None else ""
        note = f" ({self.note.category}: {self.note.message})" if self.note else ""
        return (f"node {self.node!r} ({self.op_type}) {self.part} is {self.in_file} "
                f"({self.at_run} at this run's shapes){module}{source}{note}")

    def to_dict(self) -> JsonObject:
        """The JSON form (``attribution.baked_shapes.nodes[]``)."""
        return {"node": self.node, "op_type": self.op_type, "part": self.part,
                "in_file": self.in_file, "at_run_shapes": self.at_run, "module": self.module,
                "source": self.source.to_dict() if self.source is not None else None,
                "tracer_warning": str(self.note) if self.note is not None else None}


@dataclass(frozen=True)
class BakedShapes:
    """Baked shapes, checked: the export at the run's shapes reaches parity."""

    input_names: tuple[str, ...]
    run_shapes: Shapes
    export_shapes: Shapes | None
    """The shapes the file was exported at; ``None`` where they could not be told."""
    call: ExportCall
    """The export call used at the run's shapes (the file's own)."""
    error: float
    """The worst error of that export's outputs against PyTorch's (within tolerance)."""
    nodes: tuple[BakedNode, ...] = ()
    counts: tuple[CountDifference, ...] = ()
    """Op types the file holds a different number of: a Python loop over a size, unrolled."""
    notes: tuple[TracerNote, ...] = ()
    """Every warning the tracer gave on the model's lines while exporting here."""
    loop_source: SourceLocation | None = None
    """Where the nodes of an unrolled loop were computed, where known."""

    def sizes(self) -> str:
        """``the size of x's dimension 0 (2 when exported, 4 in this run)``.

        Where the export's shapes are not known, the run's are said instead.
        """
        if self.export_shapes is None:
            shown = ", ".join(f"{name} {list(shape)}" for name, shape
                              in zip(self.input_names, self.run_shapes, strict=False))
            return f"the shapes it was made at (this run's: {shown})"
        changed = [f"{name}'s dimension {index} ({was} when exported, {now} in this run)"
                   for name, old, new in zip(self.input_names, self.export_shapes,
                                             self.run_shapes, strict=False)
                   for index, (was, now) in enumerate(zip(old, new, strict=False))
                   if was != now]
        return f"the size of {', '.join(changed)}" if changed else "the shapes it was made at"

    def where(self) -> str:
        """The nodes that hold the baked values and their lines, for a headline."""
        lines = list(dict.fromkeys(str(node.source) for node in self.nodes if node.source))
        names = ", ".join(f"{node.node!r}" for node in self.nodes[:3])
        more = ", …" if len(self.nodes) > 3 else ""
        at = f" at {', '.join(lines)}" if lines else ""
        return f"node{'s' if len(self.nodes) > 1 else ''} {names}{more}{at}"

    def unrolled(self) -> str:
        """``3 Gather, 2 Add nodes where the export at this run's shapes holds 5, 4``."""
        return (", ".join(f"{each.first} {each.op_type}" for each in self.counts)
                + " nodes where the export at this run's shapes holds "
                + ", ".join(str(each.second) for each in self.counts))

    def warning(self) -> ReportWarning:
        """The report's warning: the nodes, their lines, the check and its figures."""
        described = [node.describe() for node in self.nodes]
        if self.counts:
            at = f" at {self.loop_source}" if self.loop_source is not None else ""
            described.append(f"a Python loop over a size unrolled at its size when exported"
                             f"{at}: the file holds {self.unrolled()}")
        shown = {str(node.note) for node in self.nodes if node.note}
        others = [str(note) for note in self.notes if str(note) not in shown]
        notes = f"; the tracer warned: {'; '.join(others)}" if others else ""
        return BAKED_SHAPE.format(shapes=self.sizes(), nodes="; ".join(described),
                                  call=self.call.describe(), error=format_number(self.error),
                                  notes=notes)

    def advice(self) -> str:
        """The headline: what was baked in, where, and how to keep it symbolic."""
        if not self.nodes and self.counts:
            at = f" at {self.loop_source}" if self.loop_source is not None else ""
            return (f"the export unrolled a Python loop over {self.sizes()}{at} (the file holds "
                    f"{self.unrolled()}): {_LOOP}{NO_BUG}")
        return (f"the export baked {self.sizes()} into {self.where()}: keep it symbolic "
                f"({self.hint()}){NO_BUG}")

    def hint(self) -> str:
        """How to write the baked line so that the export keeps the size symbolic."""
        if not self.nodes:
            return _LOOP
        first = self.nodes[0]
        return symbolic_hint((first.op_type, *first.feeds), first.values, self._dimension())

    def _dimension(self) -> int:
        """The first dimension whose size changed (0 where not known)."""
        if self.export_shapes is None:
            return 0
        return next((index for old, new in zip(self.export_shapes, self.run_shapes,
                                               strict=False)
                     for index, (was, now) in enumerate(zip(old, new, strict=False))
                     if was != now), 0)

    def classification(self) -> dict[str, Any]:
        """The culprit's classification: a baked shape, with what to do."""
        return {"kind": BAKED_KIND,
                "detail": (f"the model exported here at this run's shapes with the same call "
                           f"reaches parity (max abs {format_number(self.error)}); the file "
                           f"differs from it in {len(self.nodes)} node(s)'s constants"
                           + (" and in a loop unrolled" if self.counts else "")),
                "file_with": self.advice(),
                "torch_vs_onnx64": None, "ort_error": None, "torch_error": None}

    def to_dict(self) -> JsonObject:
        """The JSON form (``attribution.baked_shapes``)."""
        return {"input_names": list(self.input_names),
                "run_shapes": [list(shape) for shape in self.run_shapes],
                "export_shapes": [list(shape) for shape in self.export_shapes]
                if self.export_shapes is not None else None,
                "export_call": self.call.describe(), "max_abs_error": self.error,
                "advice": self.advice(),
                "nodes": [node.to_dict() for node in self.nodes],
                "unrolled": [{"op_type": each.op_type, "in_file": each.first,
                              "at_run_shapes": each.second} for each in self.counts],
                "loop_source": self.loop_source.to_dict() if self.loop_source else None,
                "tracer_warnings": [str(note) for note in self.notes]}


#: How to keep a size symbolic, by the op that holds it baked.
_HINTS = {
    "Reshape": "`x.reshape(x.shape[0], -1)` or `x.flatten(1)`, the sizes not made Python "
               "ints",
    "Expand": "`y.expand_as(x)` or `y.expand(x.shape[0], -1)` without `int()`",
    "Range": "`torch.arange(x.shape[1])` without `int()`",
    "Slice": "`x[:, : x.shape[1] - 1]` with the size from `x.shape`, not `int()` of it",
    "ConstantOfShape": "`torch.zeros_like(x)` or sizes from `x.shape` without `int()`",
    "Tile": "`y.expand_as(x)` or sizes from `x.shape` without `int()`",
}
_SCALAR = "`y.mean({dim}, keepdim=True)` or `y.shape[{dim}]` without `int()`"
_ARANGE = "`torch.arange(x.shape[1])` without `int()`"
_GENERAL = "`x.shape[i]` without `int()`, `float()` or `.item()`"
_LOOP = ("compute it with tensor ops over that dimension (a sum, a cumsum, a matmul), or "
         "torch.jit.script the loop")


def symbolic_hint(op_types: Sequence[str], values: Sequence[float], dimension: int = 0) -> str:
    """How to write the size a node's baked ``values`` came from, symbolically.

    By the op that holds it or the first its value reaches (``op_types``, that node's
    first), else by the value: one number (a divisor, a scale: of ``dimension``'s size),
    or ``0, 1, ..., n-1`` (a ``torch.arange`` folded into a constant).
    """
    known = next((op for op in op_types if op in _HINTS), None)
    if known is not None:
        return _HINTS[known]
    if len(values) == 1:
        return _SCALAR.format(dim=dimension)
    if len(values) > 1 and np.array_equal(np.asarray(values), np.arange(len(values))):
        return _ARANGE
    return _GENERAL


def input_shapes_differ(export_shapes: Sequence[Sequence[int]] | None,
                        run_shapes: Sequence[Sequence[int]]) -> bool:
    """Whether the run's shapes are not the export's (unknown export shapes may differ)."""
    if export_shapes is None:
        return True
    return [tuple(shape) for shape in export_shapes] != [tuple(shape) for shape in run_shapes]
