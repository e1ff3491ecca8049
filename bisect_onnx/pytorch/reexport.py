"""The model exported again here, at other input shapes, and run: the baked-shape checks.

An export made at one shape may hold that shape as a constant (``int(x.shape[0])`` as
a divisor, a Reshape to ``[1, -1]``). Whether it does is checked by exporting the same
model with the same exporter and options at the shapes of the run and running that in
ONNX Runtime's CPU provider: :func:`export_and_run`. The exporter's warnings are kept,
the TracerWarnings naming the line of each value the tracer turned into a constant.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError, one_line
from bisect_onnx.graph.provenance import SourceLocation

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["ExportCall", "TracerNote", "Reexport", "MadeHere", "export_and_run", "export_here",
           "free_dims", "file_call", "symbolic_call", "inputs_at", "shapes_of"]

logger = logging.getLogger(__name__)

#: Free dimensions, by input position: dimension -> its name in the graph (``batch``).
FreeDims = Mapping[int, Mapping[int, str]]


@dataclass(frozen=True)
class ExportCall:
    """One ``torch.onnx.export`` call: the exporter, the opset and its other keywords.

    How a file was exported (as far as it says), an export made here again at other
    shapes, another export a fix search tries: one call, said as a user writes it.
    """

    exporter: str | None
    """``dynamo``, ``torchscript`` or ``None`` where the file does not say (made elsewhere)."""
    opset: int | None = None
    """``None``: the exporter's default."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """More ``torch.onnx.export`` keywords: ``dynamic_axes`` and ``input_names``, or
    ``dynamic_shapes``; a fix search's lever (``optimize``, ``do_constant_folding``)."""

    def describe(self) -> str:
        """``dynamo=False, opset_version=17, dynamic_axes={'x': {0: 'batch'}}``."""
        parts = [f"dynamo={self.exporter != 'torchscript'}"]
        if self.opset is not None:
            parts.append(f"opset_version={self.opset}")
        parts += [f"{name}={_shown(value)}" for name, value in self.options.items()
                  if name in _SAID]
        return ", ".join(parts)

    def call(self) -> str:
        """The exact call a user makes: ``torch.onnx.export(model, args, "model.onnx", ...)``."""
        return f'torch.onnx.export(model, args, "model.onnx", {self.describe()})'

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``details`` of a fix): exporter, opset, the plain options."""
        return {"exporter": self.exporter, "opset": self.opset,
                "options": {name: value for name, value in self.options.items()
                            if isinstance(value, (bool, int, float, str))}}


#: The keywords a call is said with: those that change the graph at the run's shapes
#: (the shapes it may change at, and the rewrites after translation).
_SAID = ("dynamic_axes", "dynamic_shapes", "optimize", "do_constant_folding")


@dataclass(frozen=True)
class TracerNote:
    """A warning the exporter gave about a line of the model (a TracerWarning, mostly)."""

    source: SourceLocation
    category: str
    message: str

    def __str__(self) -> str:
        return f"{self.category} at {self.source}: {self.message}"


@dataclass(frozen=True)
class Reexport:
    """An export made here, and what its run gave."""

    call: ExportCall
    model: onnx.ModelProto | None
    """The exported graph (weights left out where external); ``None`` if it failed."""
    outputs: list[np.ndarray] | None
    """Its final outputs in ONNX Runtime's CPU provider; ``None`` where it did not run."""
    failure: str | None = None
    """One line: why the export or its run failed."""
    notes: tuple[TracerNote, ...] = ()


def export_and_run(model: torch.nn.Module, arrays: Sequence[np.ndarray], call: ExportCall,
                   folder: Path, *, keywords: Sequence[str] = (),
                   run_on: Sequence[Sequence[np.ndarray]] = ()) -> list[Reexport]:
    """Export ``model`` on ``arrays`` with ``call`` into ``folder``, run it on each input set.

    One :class:`Reexport` per set of ``run_on`` (``arrays`` themselves where empty).
    """
    made = export_here(model, arrays, call, folder, keywords=keywords)
    if made.path is None:
        return [Reexport(call, None, None, made.failure, made.notes) for _ in run_on or [arrays]]
    runs = []
    for inputs in run_on or [arrays]:
        outputs, failure = _run(made.path, inputs)
        runs.append(Reexport(call, made.graph, outputs, failure, made.notes))
    return runs


@dataclass(frozen=True)
class MadeHere:
    """An export made here: its file and graph (weights not loaded), or why it failed."""

    path: Path | None
    graph: onnx.ModelProto | None
    notes: tuple[TracerNote, ...]
    """The warnings the exporter gave on the model's lines."""
    failure: str | None = None


def export_here(model: torch.nn.Module, arrays: Sequence[np.ndarray], call: ExportCall,
                folder: Path, *, keywords: Sequence[str] = ()) -> MadeHere:
    """``model`` exported on ``arrays`` with ``call`` into ``folder``."""
    import onnx

    from bisect_onnx.pytorch.exporting import export_model

    caught: list[warnings.WarningMessage] = []
    folder.mkdir(parents=True, exist_ok=True)
    options = dict(call.options)
    if isinstance(options.get("dynamic_shapes"), tuple):
        options["dynamic_shapes"] = _bound(model, options["dynamic_shapes"])
    try:
        exported = export_model(model, arrays, folder, exporter=call.exporter, opset=call.opset,
                                options=options, keywords=keywords, warned=caught)
    except BisectOnnxError as error:
        logger.info("export %s here failed: %s", call.describe(), error)
        return MadeHere(None, None, _notes(caught), one_line(error))
    return MadeHere(exported.path, onnx.load(str(exported.path), load_external_data=False),
                    _notes(caught))


def _bound(model: torch.nn.Module, shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    """One ``dynamic_shapes`` entry an input, grouped as ``forward`` binds the inputs.

    torch.export binds them to the signature: the inputs past the named parameters go
    to ``*args`` as one tuple (a decode step's ``forward(input_ids, mask, *past)``).
    """
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):  # no signature to bind to
        return shapes
    named = [parameter for parameter in parameters if parameter.kind in (
        parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    if (not any(parameter.kind is parameter.VAR_POSITIONAL for parameter in parameters)
            or len(shapes) <= len(named)):
        return shapes
    return (*shapes[:len(named)], tuple(shapes[len(named):]))


def _run(path: Path, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray] | None, str | None]:
    """The file's final outputs in ONNX Runtime's CPU provider, fed by position."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors raise; its log stays off stderr
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [value.name for value in session.get_inputs()]
        outputs = session.run(None, dict(zip(names, arrays, strict=False)))
    except Exception as error:  # a refusal is this export's outcome, not the run's
        return None, f"ONNX Runtime cannot run it: {one_line(error)}"
    return [np.asarray(output) for output in outputs], None


def _notes(caught: Sequence[warnings.WarningMessage]) -> tuple[TracerNote, ...]:
    """The tracer's warnings on the model's own lines, each line and message once."""
    from bisect_onnx.graph.provenance import user_source

    notes: dict[tuple[str, int, str], TracerNote] = {}
    for warning in caught:
        if warning.category.__name__ != "TracerWarning":  # deprecations, not the model's
            continue
        where = user_source(f'File "{warning.filename}", line {warning.lineno}')
        if where is None:
            continue
        message = _first_sentence(one_line(Warning(str(warning.message))))
        notes.setdefault((where.file, where.line, message),
                         TracerNote(where, warning.category.__name__, message))
    return tuple(notes.values())


def _first_sentence(text: str) -> str:
    """``Converting a tensor to a Python integer might cause the trace to be incorrect``."""
    head, dot, _ = text.partition(". ")
    return head if dot else text.rstrip(".")


def free_dims(model: onnx.ModelProto) -> dict[int, dict[int, str]]:
    """The graph inputs' dimensions with no fixed size, by input position."""
    weights = {tensor.name for tensor in model.graph.initializer}
    found: dict[int, dict[int, str]] = {}
    inputs = [value for value in model.graph.input if value.name not in weights]
    for position, value in enumerate(inputs):
        dims = value.type.tensor_type.shape.dim
        free = {index: dim.dim_param or f"dim{index}" for index, dim in enumerate(dims)
                if not dim.HasField("dim_value")}
        if free:
            found[position] = free
    return found


def file_call(model: onnx.ModelProto, exporter: str) -> ExportCall:
    """The call that exports like ``model`` did: its exporter, its opset, its free dims.

    A dynamo file's free dimensions are taken as ``Dim.AUTO``, what the exporter makes
    of ``dynamic_axes``: it keeps a dimension free yet specialises what the model's
    code makes a Python number of it, as the file may have.
    """
    opset = next((entry.version for entry in model.opset_import
                  if entry.domain in ("", "ai.onnx")), None)
    return symbolic_call(exporter, free_dims(model), _input_names(model), opset, auto=True)


def symbolic_call(exporter: str, free: FreeDims, names: Sequence[str],
                  opset: int | None = None, *, auto: bool = False) -> ExportCall:
    """The call that keeps the ``free`` dimensions symbolic with ``exporter``.

    The TorchScript exporter takes ``dynamic_axes`` by input name; the dynamo exporter
    takes ``dynamic_shapes`` by position, each free dimension ``Dim.DYNAMIC`` (which
    keeps ``int()`` of a size symbolic, or fails the export where it cannot), or
    ``Dim.AUTO`` with ``auto``.
    """
    if exporter == "torchscript":
        axes = {names[position]: dict(dims) for position, dims in free.items()
                if position < len(names)}
        return ExportCall(exporter, opset, {"input_names": list(names),
                                            "dynamic_axes": axes} if axes else {})
    if not free:
        return ExportCall(exporter, opset)
    from torch.export import Dim

    hint = Dim.AUTO if auto else Dim.DYNAMIC
    count = max([len(names), *(position + 1 for position in free)])
    shapes = tuple({index: hint for index in free[position]} if position in free else None
                   for position in range(count))
    return ExportCall(exporter, opset, {"dynamic_shapes": shapes})


def _input_names(model: onnx.ModelProto) -> list[str]:
    weights = {tensor.name for tensor in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in weights]


def shapes_of(arrays: Sequence[np.ndarray]) -> tuple[tuple[int, ...], ...]:
    """The arrays' shapes."""
    return tuple(tuple(np.shape(array)) for array in arrays)


def inputs_at(arrays: Sequence[np.ndarray], shapes: Sequence[Sequence[int]], *,
              seed: int = 0) -> list[np.ndarray]:
    """``arrays`` at other ``shapes``: their leading part, tiled where a shape is larger.

    Values stay ones the model takes (token ids stay ids): each array is tiled along a
    dimension that grows, then cut to size.
    """
    made = []
    for array, shape in zip(arrays, shapes, strict=True):
        array = np.asarray(array)
        if array.shape == tuple(shape):
            made.append(array)
            continue
        if array.ndim != len(shape) or 0 in array.shape:
            rng = np.random.default_rng(seed)
            made.append(rng.standard_normal(shape).astype(array.dtype))
            continue
        reps = [-(-want // have) for want, have in zip(shape, array.shape, strict=True)]
        tiled = np.tile(array, reps)
        made.append(np.ascontiguousarray(tiled[tuple(slice(0, want) for want in shape)]))
    return made


def _shown(value: object) -> str:
    """A ``dynamic_shapes`` value as the user writes it (``Dim.DYNAMIC``, not its repr)."""
    return repr(value).replace("DimHint(DYNAMIC)", "Dim.DYNAMIC").replace("DimHint(AUTO)",
                                                                          "Dim.AUTO")
