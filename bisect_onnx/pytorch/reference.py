"""The reference side for whatever form of PyTorch model the user has.

- an ``nn.Module``: forward hooks on every submodule;
- an ``ExportedProgram`` (a ``.pt2``): its graph run node by node, module paths from
  ``nn_module_stack``, because hooks on ``.module()``'s submodules never fire;
- a ``torch.onnx.ONNXProgram``: its own ExportedProgram as reference and its own
  ONNX model as candidate, so the graph under test is exactly the user's export;
- a TorchScript ``ScriptModule``: no hooks at all, so its own inlined graph is run
  with every value captured (only its final outputs if that graph cannot be read).

Each form also says what ``torch.onnx.export`` can take from it and what its inputs
are called.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from bisect_onnx.errors import InputError, ModelError
from bisect_onnx.pytorch.module_side import TorchModuleSide, training_mode_warning
from bisect_onnx.pytorch.program_side import ExportedProgramSide
from bisect_onnx.pytorch.script_side import ScriptModuleSide
from bisect_onnx.runtime.sides import Side
from bisect_onnx.sources.arrangement import forward_parameters
from bisect_onnx.sources.model_forms import EXPORTED_PROGRAM, TORCHSCRIPT, load_model_file

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

__all__ = ["TorchReference", "reference_for", "exit_is_a_model_error", "MODULE",
           "EXPORTED_PROGRAM", "SCRIPT_MODULE"]

logger = logging.getLogger(__name__)

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")

MODULE = "module"
# The same names as the saved-file forms they come from.
SCRIPT_MODULE = TORCHSCRIPT

NO_HOOKS_ON_SCRIPT_MODULES = (
    "a TorchScript model supports no forward hooks and its graph could not be read "
    "module by module, so only its final outputs were compared: for layer-by-layer "
    "results pass the nn.Module (FILE.py:FACTORY) or a .pt2 written by torch.export.save"
)


@dataclass
class TorchReference:
    """A model in one of its forms, ready to run as the reference side."""

    kind: str
    side: Side
    exportable: torch.nn.Module | ExportedProgram
    """What ``torch.onnx.export`` is given: the module, program or ScriptModule."""
    input_names: list[str]
    """``forward``'s positional parameters (or the program's user inputs), in order."""
    required_inputs: int
    takes_varargs: bool = False
    onnx_program: torch.onnx.ONNXProgram | None = None
    """The user's own ``ONNXProgram``, when that is what they passed."""
    example_inputs: tuple[torch.Tensor, ...] | None = None
    """Inputs stored with the model (an ExportedProgram keeps the ones it was traced on)."""
    warnings: list[str] = field(default_factory=list)


def reference_for(model: object, *, label: str | None = None,
                  trust_pickle: bool = False) -> TorchReference:
    """Wrap ``model`` (any supported form, or a path to one) as a :class:`TorchReference`."""
    import torch

    if isinstance(model, (str, Path)):
        label = label or str(model)
        model = load_model_file(Path(model), trust_pickle=trust_pickle).model
    if isinstance(model, torch.jit.ScriptModule):
        return _from_script_module(model, label)
    if isinstance(model, torch.nn.Module):
        names, required, variadic = forward_parameters(model)
        warnings = [text for text in [training_mode_warning(model)] if text]
        return TorchReference(MODULE, TorchModuleSide(model, label=label), model, names, required,
                         variadic, warnings=warnings)
    if isinstance(model, torch.export.ExportedProgram):
        return _from_program(model, EXPORTED_PROGRAM, label)
    if isinstance(model, torch.onnx.ONNXProgram):
        if model.exported_program is None:
            raise InputError("this ONNXProgram carries no ExportedProgram to run as the "
                             "reference; pass the nn.Module and the ONNX model instead")
        reference = _from_program(model.exported_program, EXPORTED_PROGRAM, label)
        reference.onnx_program = model
        return reference
    raise InputError(f"model must be a torch.nn.Module, an ExportedProgram, an ONNXProgram, "
                     f"a TorchScript module or a path to a saved one, got "
                     f"{type(model).__name__}")


def _from_script_module(model: torch.jit.ScriptModule, label: str | None) -> TorchReference:
    arguments = model.forward.schema.arguments[1:]  # the first is self
    names = [argument.name for argument in arguments]
    required = sum(not argument.has_default_value() for argument in arguments)
    try:
        side: Side = ScriptModuleSide(model, label=label)
        warnings = [text for text in [training_mode_warning(model)] if text]
        if side.uncaptured:
            shown = ", ".join(side.uncaptured[:6]) + (" ..." if len(side.uncaptured) > 6 else "")
            warnings.append(f"{len(side.uncaptured)} module call(s) of the TorchScript model "
                            f"run inside control flow or are not told apart in its graph, "
                            f"so they were not compared: {shown}")
    except (RuntimeError, AttributeError, TypeError, ValueError):
        # A graph this reading does not cover (private TorchScript APIs change between
        # torch versions): its final outputs still compare.
        logger.warning("cannot read the TorchScript graph module by module", exc_info=True)
        side, warnings = TorchModuleSide(model, label=label), [NO_HOOKS_ON_SCRIPT_MODULES]
    return TorchReference(SCRIPT_MODULE, side, model, names, required, warnings=warnings)


def _from_program(program: ExportedProgram, kind: str, label: str | None) -> TorchReference:
    names = list(program.graph_signature.user_inputs)
    examples = getattr(program, "example_inputs", None)
    args = tuple(examples[0]) if examples and not examples[1] else None
    return TorchReference(kind, ExportedProgramSide(program, label=label), program, names,
                     len(names), example_inputs=args)



def exit_is_a_model_error(entry: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
    """Turn a ``SystemExit`` raised by the user's code during ``entry`` into a ModelError.

    A ``forward`` (or a module it calls) that runs ``sys.exit(0)`` while the reference
    runs or the exporter traces it would end the process with status 0 and no verdict,
    which a CI job reads as parity. ``entry`` is a public entry point whose first
    argument is the model.
    """
    @functools.wraps(entry)
    def guarded(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        try:
            return entry(*args, **kwargs)
        except SystemExit as error:
            model = args[0] if args else kwargs.get("model")
            owner = (str(model) if isinstance(model, (str, Path))
                     else f"{type(model).__name__}.forward")
            raise ModelError(f"the model's code ({owner} or what it calls) called "
                             f"sys.exit({error.code!r}) while it ran; remove the exit: "
                             "no verdict can be given") from error
    return guarded
