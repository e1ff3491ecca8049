"""The PyTorch form's ONNX model under test: the user's file, or an export made here.

Preparation happens once per run, before any sample: the model is exported (or the
given file read), its exporter recognised, and the program whose FX node names are
the ONNX value names kept for op-level alignment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError, InputError, UsageError
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import detect_exporter
from bisect_onnx.graph.walk import graph_tensors
from bisect_onnx.graph.weights import copy_model, external_location
from bisect_onnx.pipeline.options import ExportOptions, RuntimeOptions
from bisect_onnx.pytorch.exporting import (
    EXPORTERS,
    as_translated,
    call_index_from_program,
    export_model,
    trace_program,
)
from bisect_onnx.pytorch.reference import (
    EXPORTED_PROGRAM,
    MODULE,
    SCRIPT_MODULE,
    TorchReference,
)
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture
from bisect_onnx.sources.arrangement import (
    arrange_inputs,
    check_input_count,
    graph_keyword_order,
    keyword_order,
)

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.pipeline.samples import GivenArrays

__all__ = ["PreparedCandidate", "prepare_candidate", "resolve_export", "arrange_for",
           "dynamic_batch_options", "names_the_values", "onnx_model_path"]

logger = logging.getLogger(__name__)


@dataclass
class PreparedCandidate:
    """The ONNX model under test, ready to run, and what is already known about it."""

    candidate: Runner
    source: str
    """``exported here``, or what the user passed."""
    exporter: str
    call_index: dict[str, dict[str, int]]
    keywords: list[str]
    capture: Capture | None = None
    """The reference's capture on the given inputs, when the export already ran it."""
    capture_inputs: list[np.ndarray] | None = None
    """The inputs ``capture`` was run on (the first input set)."""
    program: ExportedProgram | None = None
    """The ExportedProgram whose FX node names are the ONNX value names (op level)."""

    _looked: bool = field(default=False, init=False, repr=False)
    """Whether a program was already looked for (once per run, whatever it found)."""
    template: onnx.ModelProto | None = None
    """For an ONNX file of unknown origin: an export made here (an ``onnx.ModelProto``)
    whose values are named after ``program``'s ops, matched to the file by structure."""

    script: torch.jit.ScriptModule | None = None
    """For a TorchScript export: the traced (or scripted) model whose ATen ops the
    exporter translated, for op-level alignment by scope, op and order."""
    script_aliases: Mapping[str, str] | None = None
    """For a trace made here: the paths of modules registered twice, by object identity
    in the ``nn.Module`` traced (a trace keeps no identity; see ``shared_modules``)."""
    traced_at: tuple[tuple[int, ...], ...] | None = None
    """The input shapes ``program`` or ``script`` was traced at, where it was traced here."""

    def ran_on(self, arrays: Sequence[np.ndarray]) -> bool:
        """Whether ``capture`` is PyTorch's run on exactly these inputs."""
        known = self.capture_inputs
        return known is not None and len(known) == len(arrays) and all(
            a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
            for a, b in zip(known, arrays, strict=True))

    @property
    def wants_program(self) -> bool:
        """A file given without a program (or TorchScript graph): one may be made here."""
        return (self.program is None and self.script is None and not self._looked
                and self.exporter in ("dynamo", "unknown", "torchscript"))

    def find_program(self, reference: TorchReference, arrays: Sequence[np.ndarray],
                     folder: Path) -> None:
        """Trace the model as the exporter did; for a file of unknown origin, export it.

        A dynamo file's values are named after the traced program's ops when it is the
        same model; any other file is matched to an export made here by structure.
        """
        self._looked = True
        self.traced_at = tuple(np.shape(array) for array in arrays)
        if self.exporter == "dynamo" and reference.kind == MODULE:
            logger.info("tracing the model with torch.export for op-level alignment")
            program = trace_program(reference.exportable, arrays, self.keywords)
            if names_the_values(program, self.candidate.nodes):
                self.program = program
                self.call_index = call_index_from_program(program)
        elif self.exporter == "unknown" and reference.kind in (MODULE, EXPORTED_PROGRAM):
            self._export_template(reference, arrays, folder / "template")
        elif self.exporter == "torchscript" and not self.keywords:
            self._trace_script(reference, arrays)

    def traced_elsewhere(self, reference: TorchReference, arrays: Sequence[np.ndarray]) -> bool:
        """Whether the trace at hand was made here at other shapes than ``arrays``'.

        A trace keeps what the model computed at its shapes (``int()`` of a size, a loop
        over one): replayed at others its op values are the export's, which agree with a
        file that baked the same sizes, not the model's.
        """
        return (self.traced_at not in (None, tuple(np.shape(array) for array in arrays))
                and reference.kind == MODULE and self.exporter in ("dynamo", "torchscript"))

    def trace_at(self, reference: TorchReference, arrays: Sequence[np.ndarray],
                 folder: Path) -> None:
        """Trace the model again at ``arrays``' shapes (see :meth:`traced_elsewhere`)."""
        self.program, self.script, self._looked = None, None, False
        self.find_program(reference, arrays, folder)

    def _trace_script(self, reference: TorchReference, arrays: Sequence[np.ndarray]) -> None:
        """The graph the TorchScript exporter translated: a trace, or the scripted model."""
        from bisect_onnx.pytorch.script_ops import branches, trace_script
        from bisect_onnx.pytorch.shared_modules import identity_aliases

        if reference.kind == SCRIPT_MODULE and not branches(reference.exportable):
            self.script = reference.exportable
        elif reference.kind == MODULE:
            logger.info("tracing the model with torch.jit.trace for op-level alignment")
            try:
                self.script = trace_script(reference.exportable, arrays)
                self.script_aliases = identity_aliases(reference.exportable)
            except BisectOnnxError as error:  # module level still compares the file
                logger.info("no op level for the TorchScript file: %s", error)

    def _export_template(self, reference: TorchReference, arrays: Sequence[np.ndarray],
                         folder: Path) -> None:
        import onnx

        logger.info("exporting the model here to match a file of unknown origin")
        folder.mkdir()
        try:
            exported = export_model(reference.exportable, arrays, folder, exporter="dynamo",
                                    opset=self.candidate.opset, keywords=self.keywords)
        except BisectOnnxError as error:  # the user's file is still compared at the end
            logger.info("no template export: %s", error)
            return
        if exported.program is not None:
            self.program = exported.program
            self.template = onnx.load(str(exported.path))


def prepare_candidate(reference: TorchReference, given: GivenArrays | None, onnx_model: object,
                      export: ExportOptions, folder: Path,
                      runtime: RuntimeOptions | None = None, *,
                      program: ExportedProgram | None = None) -> PreparedCandidate:
    """The user's ONNX model (a path, a proto, an ONNXProgram's own), or an export made here.

    ``program``: the ExportedProgram a given file was translated from, where the caller
    knows it (kept where it names the file's values).
    """
    keywords = _keywords(reference, given)
    if onnx_model is not None or reference.onnx_program is not None:
        candidate, source, program = _given_candidate(reference, onnx_model, folder,
                                                      runtime or RuntimeOptions(), program)
        exporter = detect_exporter(candidate.nodes)
        if not isinstance(given, Mapping):  # random draws or a list: in the graph's order
            keywords = _graph_keywords(reference, candidate)
        return PreparedCandidate(candidate, source, exporter, call_index_from_program(program),
                                 keywords, program=program if exporter == "dynamo" else None)
    candidate, capture, exported = _export_candidate(reference, given, export, folder,
                                                     runtime or RuntimeOptions())
    arrays = arrange_for(reference, None, given) if given is not None else None
    exported_at = (arrays if arrays is not None else reference.example_inputs or None)
    return PreparedCandidate(candidate, "exported here", export.exporter or "dynamo",
                             exported.call_index, keywords,
                             capture if given is not None else None,
                             program=exported.program, capture_inputs=arrays,
                             traced_at=(tuple(tuple(each.shape) for each in exported_at)
                                        if exported.program is not None and exported_at
                                        else None))


def resolve_export(reference: TorchReference, onnx_model: object,
                   export: ExportOptions | None) -> ExportOptions:
    """Check the export options against the model form; fill in the exporter."""
    if export is not None and (onnx_model is not None or reference.onnx_program is not None):
        raise UsageError("export options apply to an export made here; drop them when "
                         "comparing an existing ONNX model")
    if onnx_model is not None and reference.onnx_program is not None:
        raise UsageError("an ONNXProgram brings its own ONNX model; pass onnx_model only "
                         "with an nn.Module or ExportedProgram")
    export = export or ExportOptions()
    exporter = export.exporter
    if exporter is None:
        exporter = "torchscript" if reference.kind == SCRIPT_MODULE else "dynamo"
    if exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if exporter == "dynamo" and reference.kind == SCRIPT_MODULE:
        raise UsageError("the dynamo exporter cannot take a TorchScript model; use the "
                         "torchscript exporter (--exporter torchscript)")
    if exporter == "torchscript" and reference.kind == EXPORTED_PROGRAM:
        raise UsageError("the TorchScript exporter cannot take an ExportedProgram; use the "
                         "dynamo exporter (--exporter dynamo)")
    if export.dynamic_batch and reference.kind == EXPORTED_PROGRAM:
        raise UsageError("an ExportedProgram's shapes were fixed when it was exported: "
                         "export it with dynamic_shapes instead of --dynamic")
    overridden = {"dynamic_shapes", "dynamic_axes", "input_names"} & set(export.torch_kwargs)
    if export.dynamic_batch and overridden:
        raise UsageError(f"dynamic_batch sets {', '.join(sorted(overridden))} itself; drop "
                         "one or the other")
    return replace(export, exporter=exporter)


def _given_candidate(reference: TorchReference, onnx_model: object, folder: Path,
                     runtime: RuntimeOptions, known: ExportedProgram | None = None):
    """The user's ONNX model, and the ExportedProgram it was made from, if known."""
    given = onnx_model if onnx_model is not None else reference.onnx_program
    path, source = onnx_model_path(given, folder)
    # An ONNXProgram still knows its ExportedProgram, and so which call of a reused
    # module each node ran in; so does an ExportedProgram compared with an export of it.
    program = getattr(given, "exported_program", None)
    if program is None:
        program = known
    if program is None and reference.kind == EXPORTED_PROGRAM:
        program = as_translated(reference.exportable)
    candidate = _runtime_side(path, runtime)
    return candidate, source, program if names_the_values(program, candidate.nodes) else None


def _runtime_side(path: Path, runtime: RuntimeOptions) -> Runner:
    return runtime.runner(path)


def names_the_values(program: ExportedProgram | None, nodes: Sequence[NodeInfo]) -> bool:
    """Whether ``program`` is the one the ONNX graph was translated from.

    Its FX node names must account for the FX nodes nearly all ONNX nodes say they
    were made from; a program the exporter decomposed differently (another torch
    version, say) would pair values of different ops.
    """
    graph = getattr(program, "graph", None)
    made_from = [node.torch.fx_node for node in nodes if node.torch and node.torch.fx_node]
    if graph is None or not made_from:
        return False
    names = {node.name for node in graph.nodes}
    return sum(name in names for name in made_from) >= 0.95 * len(made_from)


def _export_candidate(reference: TorchReference, given: GivenArrays | None, export: ExportOptions,
                      folder: Path, runtime: RuntimeOptions):
    """Export the model here; the reference runs first on the export's inputs."""
    if given is not None:
        arrays = arrange_for(reference, None, given)
    elif reference.example_inputs is not None:
        arrays = [np.asarray(tensor.detach().cpu()) for tensor in reference.example_inputs]
    else:
        raise UsageError("no inputs: pass inputs (--input FILE), or an existing ONNX model "
                         "(--onnx FILE) to draw random inputs from its input specification")
    # A forward that fails says so more plainly than the exporter, which wraps the same
    # failure in pages of advice.
    keywords = _keywords(reference, given)
    logger.info("running the PyTorch reference")
    emit(CAPTURE_STARTED, "pytorch")
    capture = reference.side.run(arrays, keywords=keywords)
    if not capture.outputs:
        raise InputError("the model's forward returned no tensor, so there is nothing to "
                         "compare; return the tensors to check")
    options = dict(export.torch_kwargs)
    if export.dynamic_batch:
        options.update(dynamic_batch_options(export.exporter, reference, arrays))
    exported = export_model(reference.exportable, arrays, folder, exporter=export.exporter,
                            opset=export.opset, options=options, keywords=keywords)
    if export.save_to is not None:
        _keep_copy(exported.path, Path(export.save_to))
    return _runtime_side(exported.path, runtime), capture, exported


def _keywords(reference: TorchReference, given: GivenArrays | None) -> list[str]:
    """Names of the inputs that go by keyword (none unless they skip a parameter)."""
    if given is None:
        return []
    return keyword_order(given, forward_names=reference.input_names,
                         required=reference.required_inputs) or []


def _graph_keywords(reference: TorchReference, candidate: Runner) -> list[str]:
    """Names for inputs in the graph's order, when they must go to ``forward`` by name."""
    if reference.kind != MODULE:  # a program's inputs are the graph's; TorchScript's positional
        return []
    return graph_keyword_order([spec.name for spec in candidate.inputs],
                               forward_names=reference.input_names,
                               required=reference.required_inputs)


def arrange_for(reference: TorchReference, candidate: Runner | None,
                given: list[np.ndarray] | dict[str, np.ndarray]) -> list[np.ndarray]:
    """The given inputs in the order the model (and its ONNX graph) takes them."""
    keywords = _keywords(reference, given)
    if keywords:
        return [given[name] for name in keywords]
    onnx_names = [spec.name for spec in candidate.inputs] if candidate else None
    arrays = arrange_inputs(given, forward_names=reference.input_names, onnx_names=onnx_names,
                            required=reference.required_inputs,
                            weight_names=_weight_names(reference) if isinstance(given, dict)
                            else ())
    if candidate is None:
        check_input_count(arrays, names=reference.input_names,
                          required=reference.required_inputs,
                          variadic=reference.takes_varargs, owner=reference.side.describe()
                          .get("class", "model"))
    return arrays


def _weight_names(reference: TorchReference) -> list[str]:
    """The model's state_dict keys: a module's method, an ExportedProgram's attribute."""
    state = getattr(reference.exportable, "state_dict", None)
    return list(state() if callable(state) else state or {})


def dynamic_batch_options(exporter: str, reference: TorchReference,
                          arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """The export keywords that make dimension 0 of every input dynamic."""
    import torch

    if exporter == "dynamo":
        return {"dynamic_shapes": tuple(
            {0: torch.export.Dim.DYNAMIC} if array.ndim else None for array in arrays)}
    names = reference.input_names[: len(arrays)]
    return {"input_names": names,
            "dynamic_axes": {name: {0: "batch"} for name, array in zip(names, arrays,
                                                                        strict=True)
                             if array.ndim}}


def onnx_model_path(onnx_model: object, folder: Path) -> tuple[Path, str]:
    """A path ORT can read, and how to name the model in the report."""
    if isinstance(onnx_model, (str, Path)):
        return Path(onnx_model), str(onnx_model)
    import onnx

    path = folder / "given.onnx"
    if isinstance(onnx_model, onnx.ModelProto):
        if onnx_model.ByteSize() > _PROTO_LIMIT:
            raise InputError("the onnx.ModelProto is over 2 GB, the most one protobuf "
                             "message can be written as; save it with external data "
                             "(onnx.save(..., save_as_external_data=True)) and pass the path")
        if any(external_location(tensor) is not None
               for tensor in graph_tensors(onnx_model.graph)):
            raise InputError("the onnx.ModelProto names external weights relative to a "
                             "folder it no longer knows (loaded with load_external_data="
                             "False?); pass the path of its .onnx file instead")
        onnx.save(onnx_model, str(path))
        return path, "(onnx.ModelProto)"
    if hasattr(onnx_model, "model_proto") and hasattr(onnx_model, "save"):
        onnx_model.save(str(path))  # a torch.onnx.ONNXProgram, external data included
        return path, "(torch.onnx.ONNXProgram)"
    raise InputError(f"onnx_model must be a path, an onnx.ModelProto or a "
                     f"torch.onnx.ONNXProgram, got {type(onnx_model).__name__}")


# The largest protobuf message there is; a bigger model must keep its weights outside.


_PROTO_LIMIT = 2**31 - 1


def _keep_copy(exported: Path, target: Path) -> None:
    """Copy the export to where the user asked, its weights inline or beside it.

    External weights are streamed into one data file named after the target (nothing
    else there is overwritten), never all in memory; copied, not linked, because the
    export's own data file is still read in this run (a repro, a template).
    """
    try:
        copy_model(exported, target, link=False)
    except OSError as error:
        raise InputError(f"cannot save the ONNX export to {target}: {error.strerror}; "
                         "choose a writable path for --save-onnx") from error
