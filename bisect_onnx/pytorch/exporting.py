"""Export a PyTorch model to ONNX, with either exporter, into a folder we own."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.chatter import chatter_logged
from bisect_onnx.errors import ModelError, UsageError, one_line
from bisect_onnx.events import EXPORT_STARTED, emit
from bisect_onnx.pytorch.calls import call_of_stack_key
from bisect_onnx.pytorch.module_side import split_keywords, to_tensor
from bisect_onnx.pytorch.private_apis import PrivateApiMissing, prepare_for_export

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

__all__ = ["EXPORTERS", "ExportResult", "export_model", "call_index_from_program",
           "as_translated", "trace_program", "export_failure", "quiet_exporter"]

logger = logging.getLogger(__name__)

#: ``dynamo``: torch.export then ONNX translation (torch's default since 2.9);
#: ``torchscript``: the older tracer, ``torch.onnx.export(..., dynamo=False)``.
EXPORTERS = ("dynamo", "torchscript")


@dataclass(frozen=True)
class ExportResult:
    """The exported file and what the exporter knew that the file does not say."""

    path: Path
    call_index: dict[str, dict[str, int]]
    """Which call of each module every FX node ran in (dynamo only; from ``nn_module_stack``)."""
    program: ExportedProgram | None = None
    """The ExportedProgram the dynamo exporter translated (after its decompositions),
    whose FX node names are the ONNX value names; ``None`` for TorchScript."""


def export_model(
    model: torch.nn.Module,
    inputs: Sequence[np.ndarray],
    folder: Path,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    options: Mapping[str, Any] | None = None,  # torch.onnx.export's keywords, passed on
    keywords: Sequence[str] = (),
    warned: list[warnings.WarningMessage] | None = None,
) -> ExportResult:
    """Export ``model`` on ``inputs`` into ``folder`` with the chosen exporter.

    ``options`` are passed to ``torch.onnx.export`` as they are (``dynamic_shapes``,
    ``custom_translation_table``, ...). ``warned``: a list the exporter's warnings are
    also added to (the tracer's, which name the lines whose values it baked in).
    """
    import torch

    if opset is not None and opset < 7:
        raise UsageError(f"opset {opset} is not an ONNX opset torch can export to; "
                         "use 17 or later (or leave it to the exporter)")
    # A TorchScript module's type is RecursiveScriptModule; its source class is kept.
    name = getattr(model, "original_name", None) or type(model).__name__
    positional, kwargs = split_keywords([to_tensor(array) for array in inputs], keywords)
    args = tuple(positional)
    options = {**(options or {}), **({"kwargs": kwargs} if kwargs else {})}
    _check_options(torch.onnx.export, options)
    path = folder / "model.onnx"
    logger.info("exporting %s with the %s exporter", name, exporter)
    emit(EXPORT_STARTED, exporter)
    program = None
    try:
        with quiet_exporter(f"the {exporter} exporter", native=exporter == "torchscript",
                            warned=warned):
            if exporter == "dynamo":
                program = torch.onnx.export(model, args, dynamo=True, opset_version=opset,
                                            verbose=False, **options)
            else:
                torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                                  **options)
    except Exception as error:  # a TypeError too: options were checked, so it is the model's
        logger.debug("export failed", exc_info=True)
        raise ModelError(export_failure(exporter, model, error)) from error
    if program is not None:
        _save(program, path)
    exported = getattr(program, "exported_program", None)
    return ExportResult(path=path, call_index=call_index_from_program(exported),
                        program=exported)


# What export_model passes to torch.onnx.export itself, and where a user sets it.
_SET_HERE = {"model": "the model argument", "args": "the inputs",
             "f": "ExportOptions(save_to=...) to keep the file",
             "dynamo": "ExportOptions(exporter=...)", "opset_version": "ExportOptions(opset=...)",
             "verbose": "bisect-onnx's own log (-v)"}


def _check_options(export: Callable[..., object], options: Mapping[str, object]) -> None:
    """Refuse options ``torch.onnx.export`` does not take, before the export runs.

    A ``TypeError`` from the export itself cannot tell a bad option from a model whose
    ``forward`` rejects its arguments while being traced, so options are checked here.
    """
    try:
        parameters = inspect.signature(export).parameters
    except (TypeError, ValueError):  # no signature to check against
        return
    clashing = sorted(set(options) & set(_SET_HERE))
    if clashing:
        raise UsageError(f"torch_kwargs sets {', '.join(clashing)}, which bisect-onnx "
                         f"passes to torch.onnx.export itself; use "
                         f"{'; '.join(_SET_HERE[name] for name in clashing)} instead")
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
        return
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        raise UsageError(f"torch.onnx.export takes no option {', '.join(unknown)}; "
                         f"drop it from torch_kwargs (its options: "
                         f"{', '.join(name for name in parameters if name not in _SET_HERE)})")


def _save(program: torch.onnx.ONNXProgram, path: Path) -> None:
    """Write the dynamo exporter's ONNXProgram into our folder: the export's last step."""
    try:
        with quiet_exporter("the dynamo exporter"):
            program.save(str(path))
    except OSError as error:
        raise ModelError(f"the dynamo exporter's ONNX model could not be written to the "
                         f"temporary folder {path.parent}: {error.strerror}; free disk space "
                         "there (TMPDIR sets where it is)") from error
    except Exception as error:
        logger.debug("saving the export failed", exc_info=True)
        raise ModelError(f"the dynamo exporter translated the model but could not save "
                         f"the ONNX file: {_summarize(error)}; {_ELSEWHERE}"
                         ) from error


def export_failure(exporter: str, model: object, error: BaseException) -> str:
    """One line: which exporter, which of its steps failed and why, and what to try next.

    The dynamo exporter says which of its three steps failed (``This is step 2/3``):
    tracing with torch.export, its decompositions, the translation to ONNX. With
    torch 2.13, T5 and Swin fail in the decompositions (a ``view`` on non-contiguous
    strides) while the TorchScript exporter handles both, so the other exporter is
    suggested wherever it applies to the model's form.
    """
    name = getattr(model, "original_name", None) or type(model).__name__
    step = _failed_step(error) if exporter == "dynamo" else None
    where = f" ({step})" if step else ""
    cache = _cache_output(error)
    if cache is not None:
        return (f"the {exporter} exporter could not export {name}{where}: its forward "
                f"returns a {cache} (the key-value cache of use_cache=True), which "
                "neither exporter takes as an output; set model.config.use_cache = False "
                "before bisecting, or wrap the model in a module whose forward passes "
                "use_cache=False (or flattens the cache) and returns tensors only")
    branch = _data_dependent_branch(error)
    if branch is not None:
        return (f"the {exporter} exporter could not export {name}{where}: its forward branches "
                f"on a tensor's value{branch}, which torch.export cannot trace; write the "
                "branch with torch.cond (or both sides with torch.where) and export again. "
                "The TorchScript exporter would trace one side and bake it in: its file "
                "agrees only on inputs that take the same side")
    return (f"the {exporter} exporter could not export {name}{where}: {_summarize(error)}; "
            f"{_next_steps(exporter, model)}")


# torch.export's words for a Python ``if`` (or ``int()``, ``.item()``) on a tensor's
# value, and the user's line it names.
_DATA_DEPENDENT = re.compile(r"GuardOnDataDependentSymNode|Could not guard on data-dependent")
_RAISING_CALL = re.compile(r'The following call raised this error:\s*File "([^"]+)", '
                           r"line (\d+), in (\w+)")


def _data_dependent_branch(error: BaseException) -> str | None:
    """Where the export failed on a data-dependent branch; ``None`` for another failure.

    `` (at file:line, in forward)``, or ``""`` where the error names no line.
    """
    texts = [str(each) for each in _chain(error)]
    if not any(_DATA_DEPENDENT.search(text) for text in texts):
        return None
    found = next((match for text in texts for match in [_RAISING_CALL.search(text)] if match),
                 None)
    return f" (at {found[1]}:{found[2]}, in {found[3]})" if found else ""


# A Hugging Face decoder's default use_cache=True returns a Cache object: torch.export
# finds no pytree for it, and the TorchScript tracer takes only tensors, tuples, lists
# and dicts. Each exporter's advice is to try the other, which fails the same way.
_CACHE_OUTPUT = re.compile(r"Found <class '(?:[\w.]+\.)?(\w*Cache)'> in output"
                           r"|received an input of unsupported type: (\w*Cache)\b")


def _cache_output(error: BaseException) -> str | None:
    """The cache class a failed export stopped at (``DynamicCache``), if that is why."""
    for each in _chain(error):
        found = _CACHE_OUTPUT.search(str(each))
        if found:
            return found.group(1) or found.group(2)
    return None


# The dynamo exporter's own words for its steps, and ours.
_STEP = re.compile(r"This is step (\d)/3")
_STEPS = {
    "1": "step 1 of 3, tracing the model with torch.export",
    "2": "step 2 of 3, the exporter's decompositions of the traced graph",
    "3": "step 3 of 3, the translation of the traced graph to ONNX",
}
_ELSEWHERE = ("export the model with a tool that works for it and compare that file "
              "(--onnx FILE; onnx_model= in Python)")


def _failed_step(error: BaseException) -> str | None:
    """Which of the dynamo exporter's steps an error comes from, in words."""
    for each in _chain(error):  # the step is said by the outermost exporter error
        found = _STEP.search(str(each))
        if found:
            return _STEPS.get(found.group(1))
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its causes, outermost first."""
    for _ in range(10):  # a bound, in case of a cycle
        yield error
        if error.__cause__ is None:
            return
        error = error.__cause__


def _next_steps(exporter: str, model: object) -> str:
    """What may work instead: the other exporter where it applies, a file made elsewhere."""
    if exporter == "dynamo" and _is_plain_module(model):
        return ("the TorchScript exporter may work where this one fails (it exports T5 "
                "and Swin, which torch 2.13's dynamo exporter does not): --exporter "
                "torchscript (ExportOptions(exporter=\"torchscript\") in Python), or "
                + _ELSEWHERE)
    if exporter == "torchscript" and _is_plain_module(model):
        return ("the dynamo exporter may work where this one fails: --exporter dynamo "
                "(ExportOptions(exporter=\"dynamo\") in Python), or " + _ELSEWHERE)
    return _ELSEWHERE


def _is_plain_module(model: object) -> bool:
    """Whether both exporters take the model: an ``nn.Module`` that is not TorchScript."""
    import torch

    return isinstance(model, torch.nn.Module) and not isinstance(model, torch.jit.ScriptModule)


def call_index_from_program(exported_program: object | None) -> dict[str, dict[str, int]]:
    """Map FX node name -> module path -> call number, from ``nn_module_stack``.

    torch.export keys a module's stack entry ``L__self__relu`` on its first call
    and ``L__self__relu@1`` on the second; the ONNX metadata keeps only the path.
    """
    index: dict[str, dict[str, int]] = {}
    graph = getattr(exported_program, "graph", None)
    if graph is None:
        return index
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        calls = {}
        for key, entry in stack.items():
            path = entry[0] if isinstance(entry, tuple) and entry else None
            if isinstance(path, str):
                calls[path] = call_of_stack_key(key)
        if calls:
            index[node.name] = calls
    return index


def trace_program(model: torch.nn.Module, inputs: Sequence[np.ndarray],
                  keywords: Sequence[str] = ()) -> ExportedProgram | None:
    """The program the dynamo exporter would translate ``model`` from, or ``None``.

    For an ONNX file exported elsewhere from this very model: tracing it again gives
    the FX node names its values were named after (checked by the caller).
    """
    import torch

    positional, kwargs = split_keywords([to_tensor(array) for array in inputs], keywords)
    try:
        with quiet_exporter("torch.export"):
            program = torch.export.export(model, tuple(positional), kwargs or None, strict=False)
    except Exception:
        logger.debug("torch.export could not trace the model", exc_info=True)
        return None
    return as_translated(program)


def as_translated(program: ExportedProgram) -> ExportedProgram | None:
    """``program`` after the decompositions the dynamo exporter runs before translating.

    The ONNX value names are the FX node names of that program, not of the one the
    user saved (``batch_norm`` there becomes ``_native_batch_norm_legit_no_training``
    and a ``getitem``). torch keeps this step private
    (:func:`~bisect_onnx.pytorch.private_apis.prepare_for_export`), so where it is
    missing or refuses the program, the exporter's own public path runs instead
    (:func:`_through_the_exporter`). ``None`` when neither can decompose the program.
    """
    try:
        prepare = prepare_for_export()
    except PrivateApiMissing as error:
        logger.info("%s; taking the exporter's public path", error)
        return _through_the_exporter(program)
    try:
        with quiet_exporter("the dynamo exporter's decompositions"):
            return prepare(program)
    except Exception:  # a program it cannot decompose: the exporter may still
        logger.debug("could not run the exporter's decompositions", exc_info=True)
        return _through_the_exporter(program)


def _through_the_exporter(program: ExportedProgram) -> ExportedProgram | None:
    """The program ``torch.onnx.export`` translates, from a whole export of ``program``.

    Public and sure to match what the exporter does, but it pays for the translation
    to ONNX too (seconds on a large model), so it is the fallback, not the way.
    """
    import torch

    try:
        with quiet_exporter("the dynamo exporter"):
            exported = torch.onnx.export(program, dynamo=True, optimize=False, verbose=False)
    except Exception as error:  # the exporter fails on it too: op level goes without
        logger.info("op level: the dynamo exporter cannot decompose the traced program "
                    "(%s: %s); module level compares the file", type(error).__name__,
                    one_line(error))
        return None
    return getattr(exported, "exported_program", None)


def quiet_exporter(source: str = "the exporter", *, native: bool = False,
                   warned: list[warnings.WarningMessage] | None = None,
                   ) -> contextlib.AbstractContextManager[None]:
    """Keep the exporter's chatter (prints, warnings, its loggers) in our log, off the terminal.

    ``native`` for the TorchScript exporter, whose C++ code prints its whole graph to
    stderr when a pass fails (torch 2.13 turns that log on in every export).
    ``warned``: a list its warnings are also added to (the TracerWarnings among them).
    """
    # (torch.__trace logs every traced op at DEBUG, into any capturing handler; the
    # shape solver logs a data-dependent branch torch.export then raises about.)
    return chatter_logged(source, native=native, kept=warned, loggers=(
        "torch.onnx", "torch.__trace", "torch.export", "torch.fx.experimental.symbolic_shapes",
        "torch._dynamo", "onnxscript", "onnx_ir"))


def _summarize(error: BaseException) -> str:
    """The exporter's reason in one readable line (its messages run to pages).

    The exporter wraps the real failure (``TorchExportError: Failed to export the
    model with torch.export. This is step 1/3 ...``); the innermost cause says why.
    """
    innermost = error
    for _ in range(10):  # a bound, in case of a cycle
        if innermost.__cause__ is None:
            break
        innermost = innermost.__cause__
    return f"{type(innermost).__name__}: {one_line(innermost)}"
