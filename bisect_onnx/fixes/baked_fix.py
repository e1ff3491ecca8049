"""The export call that does not bake the shapes in, checked at both shapes.

For a divergence the export's baked shapes explain
(:class:`~bisect_onnx.search.baked_shapes.BakedShapes`), the fix is an export that
keeps the sizes symbolic: the dynamo exporter with ``dynamic_shapes`` of
``Dim.DYNAMIC`` built from the free dimensions (``Dim.DYNAMIC`` keeps ``int()`` of a
size symbolic or fails the export; ``Dim.AUTO``, what ``dynamic_axes`` becomes,
specialises it as the tracer does), or the other exporter with those dimensions. Each is
exported at the shapes the file was exported at, as the user would, then run at those
shapes and at this run's: only a call whose export reaches parity at both is a fix.
Where none does, the line to change is said, and why.
"""

from __future__ import annotations

import linecache
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.registry import register
from bisect_onnx.fixes.trial import FixKind, FixResult, OutputFigures, output_figures
from bisect_onnx.pytorch.reexport import ExportCall, export_and_run, inputs_at, symbolic_call
from bisect_onnx.search.baked_shapes import BAKED_KIND, BakedShapes

if TYPE_CHECKING:
    import torch

    from bisect_onnx.judge.tolerances import Tolerance

__all__ = ["SymbolicExport", "SymbolicSearch", "search_symbolic_export", "check_symbolic_exports",
           "BAKED_SHAPES_KEY"]

logger = logging.getLogger(__name__)

#: The ``FixContext.extra`` key the pipeline hands the baked shapes under.
BAKED_SHAPES_KEY = "baked_shapes"


@dataclass(frozen=True)
class SymbolicExport:
    """One export call checked at the export's shapes and at the run's."""

    call: ExportCall
    at_export: OutputFigures | None
    at_run: OutputFigures | None
    failure: str | None = None
    seconds: float = 0.0

    @property
    def fixes(self) -> bool:
        """Whether its export reaches parity at both shapes."""
        return (self.at_export is not None and self.at_run is not None
                and self.at_export.passes and self.at_run.passes)

    def describe(self) -> str:
        """``dynamo=True, dynamic_shapes=...: max abs 0.4 at this run's shapes``."""
        if self.failure is not None:
            return f"{self.call.describe()}: {self.failure}"
        worst = [f"max abs {figures.max_abs:.3g} at {where}" for figures, where in
                 ((self.at_export, "the export's shapes"), (self.at_run, "this run's shapes"))
                 if figures is not None and not figures.passes]
        return f"{self.call.describe()}: {', '.join(worst) or 'passes'}"


@dataclass(frozen=True)
class SymbolicSearch:
    """The calls tried, and the line to change where none fixes it."""

    tried: tuple[SymbolicExport, ...]
    line_to_change: str

    @property
    def fixed(self) -> tuple[SymbolicExport, ...]:
        """The calls that reach parity at both shapes."""
        return tuple(each for each in self.tried if each.fixes)

    def summary(self) -> str:
        """One line: the fix, or what was tried and the line to change."""
        if self.fixed:
            return (f"fix (checked): export with {self.fixed[0].call.describe()}: it reaches "
                    "parity at the export's shapes and this run's")
        tried = "; ".join(each.describe() for each in self.tried) or "no other export call"
        return f"no export call keeps the size symbolic (tried {tried}); {self.line_to_change}"


def check_symbolic_exports(model: torch.nn.Module, arrays: Sequence[np.ndarray],
                           reference_outputs: Sequence[np.ndarray], baked: BakedShapes, *,
                           names: Sequence[str], free: Mapping[int, Mapping[int, str]],
                           tolerance: Tolerance, keywords: Sequence[str] = ()
                           ) -> SymbolicSearch:
    """Each call that may keep the sizes symbolic, exported and run at both shapes."""
    import torch

    line = _line_to_change(baked)
    if baked.export_shapes is None:
        return SymbolicSearch((), f"the shapes the file was exported at are not known; {line}")
    at_export = inputs_at(arrays, baked.export_shapes)
    expected = _torch_outputs(model, at_export, keywords)
    scripted = isinstance(model, torch.jit.ScriptModule)
    tried = []
    for call in _calls(baked.call, free, names, scripted=scripted):
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bisect-onnx-symbolic-") as folder:
            runs = export_and_run(model, at_export, call, Path(folder), keywords=keywords,
                                  run_on=[at_export, arrays])
        figures = [output_figures(want, run.outputs, rtol=tolerance.rtol, atol=tolerance.atol)
                   if run.outputs is not None else None
                   for want, run in zip((expected, reference_outputs), runs, strict=True)]
        # The exporter's reason, without its advice on what else to try.
        failure = next((run.failure.split("; ")[0] for run in runs if run.failure), None)
        tried.append(SymbolicExport(call, *figures, failure=failure,
                                    seconds=time.perf_counter() - started))
        logger.info("symbolic export: %s", tried[-1].describe())
    return SymbolicSearch(tuple(tried), line)


def _calls(used: ExportCall, free: Mapping[int, Mapping[int, str]], names: Sequence[str], *,
           scripted: bool) -> list[ExportCall]:
    """The calls to try: dynamo with ``Dim.DYNAMIC``, then the TorchScript exporter.

    The call that made the file is left out; a TorchScript model has the one exporter.
    """
    calls = [] if scripted else [symbolic_call("dynamo", free, names, _dynamo_opset(used))]
    calls.append(symbolic_call("torchscript", free, names, used.opset))
    return [call for call in calls if call.describe() != used.describe()
            and not (call.exporter == used.exporter == "torchscript")]


def _dynamo_opset(used: ExportCall) -> int | None:
    """The file's opset where the dynamo exporter writes it natively (18 on), else its own."""
    return used.opset if used.opset is not None and used.opset >= 18 else None


def _torch_outputs(model: torch.nn.Module, arrays: Sequence[np.ndarray],
                   keywords: Sequence[str]) -> list[np.ndarray]:
    from bisect_onnx.fixes.exporter_trials import torch_outputs
    from bisect_onnx.pytorch.module_side import split_keywords, to_tensor

    args, kwargs = split_keywords([to_tensor(array) for array in arrays], keywords)
    return torch_outputs(model, args, kwargs)


def _line_to_change(baked: BakedShapes) -> str:
    """``change line 22 of m.py, `return y / int(y.shape[0])`: ... keep it symbolic (...)``."""
    source = next((node.source for node in baked.nodes if node.source is not None),
                  baked.loop_source)
    if source is None:
        source = next((note.source for note in baked.notes), None)
    note = next((node.note for node in baked.nodes if node.note is not None), None)
    why = (f"the tracer warned: {note.message}" if note is not None else
           "a Python loop over a size runs as many times as the size was when exported"
           if not baked.nodes else
           "it makes a size a Python number, which the export holds as the size it was "
           "made at")
    if source is None:
        return f"change the line that makes a size a Python number ({why}): {baked.hint()}"
    code = linecache.getline(source.file, source.line).strip()
    shown = f", `{code}`" if code else ""
    return f"change line {source.line} of {source.file}{shown} ({why}): {baked.hint()}"


def search_symbolic_export(context: FixContext) -> list[FixResult]:
    """The registered search: the export calls that reach parity at both shapes."""
    from bisect_onnx.pytorch.reexport import free_dims

    baked = context.extra.get(BAKED_SHAPES_KEY)
    if not isinstance(baked, BakedShapes):
        raise FixUnavailable("no baked shape was checked for this run")
    if context.torch_model is None or not hasattr(context.torch_model, "forward"):
        raise FixUnavailable("no PyTorch module to export again")
    arrays = list(context.inputs.values())
    search = check_symbolic_exports(
        context.torch_model, arrays, context.reference_outputs, baked,
        names=list(context.inputs), free=free_dims(context.candidate),
        tolerance=context.tolerance, keywords=tuple(context.torch_keywords))
    if not search.fixed:
        raise FixUnavailable(search.summary())
    return [FixResult(FixKind.SYMBOLIC_EXPORT, f"export with {each.call.describe()}",
                      context.before, each.at_run,
                      details={"export_call": each.call.describe(),
                               "at_export_shapes": each.at_export.as_dict(),
                               "export_shapes": [list(shape) for shape in baked.export_shapes],
                               "run_shapes": [list(shape) for shape in baked.run_shapes]},
                      seconds=each.seconds)
            for each in search.fixed]


register(BAKED_KIND, search_symbolic_export)
