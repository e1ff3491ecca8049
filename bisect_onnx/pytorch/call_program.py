"""One module call traced alone: its ops' values under the whole model's FX names.

For a dynamo file exported elsewhere, op-level values need the program the exporter
translated. Tracing the whole model again takes seconds; where the divergence is
known to lie inside one module call, that call alone is enough: its arguments are
recorded in one more PyTorch forward (stopped as the call starts), the module is
exported alone on them and decomposed as the exporter does, and its ops are run and
renamed to the whole model's names (:mod:`bisect_onnx.pytorch.call_names`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from bisect_onnx.errors import BisectOnnxError, one_line
from bisect_onnx.pytorch.call_names import (
    CallNames,
    InputsUnnamed,
    MadeFrom,
    NamesRefused,
    map_call_names,
    unnamed_inputs,
)
from bisect_onnx.pytorch.calls import call_name, call_of_stack_key
from bisect_onnx.pytorch.exporting import as_translated, quiet_exporter
from bisect_onnx.pytorch.module_side import buffers_restored, split_keywords, to_tensor
from bisect_onnx.pytorch.op_values import OpCapture, capture_ops
from bisect_onnx.pytorch.private_apis import tree_flatten, tree_map
from bisect_onnx.pytorch.program_side import module_stack

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["CallOpCapture", "CallArguments", "InputsUnnamed", "record_call", "trace_call"]

_Arguments = TypeVar("_Arguments")

logger = logging.getLogger(__name__)


@dataclass
class CallOpCapture(OpCapture):
    """The ops of one module call, by the whole model's FX names (a partial op capture)."""

    call: str = ""
    """The call traced alone (``layer3.4``, ``blocks.0.act@1``)."""
    program: ExportedProgram | None = None
    """That call's program, decomposed as the exporter does, its ops and user inputs
    renamed to the whole model's names (weights keep the call's own)."""
    nodes: list[NodeInfo] = field(default_factory=list)
    """The ONNX nodes of the call: what its op values are aligned with."""


@dataclass
class CallArguments:
    """What one module call was given, and the calls around and inside it so far."""

    args: tuple[object, ...]
    kwargs: dict[str, object]
    scopes: tuple[str, ...]
    """Call names of the modules around the call and of the call itself, outermost first."""
    inner_calls: dict[str, int] = field(default_factory=dict)
    """Path inside the call's module -> calls of that submodule before this call began."""
    around: tuple[CallArguments, ...] = ()
    """The calls enclosing it, innermost first, each as it started (``record_call``'s
    ``around``)."""


class _Recorded(Exception):
    """Raised by the pre-hook once the wanted call's arguments are held: stop the forward."""


def record_call(model: torch.nn.Module, inputs: Sequence[np.ndarray], keywords: Sequence[str],
                path: str, call: int, *, around: bool = False) -> CallArguments | None:
    """The arguments of call ``call`` of submodule ``path``, from a forward stopped there.

    ``around``: the calls enclosing it are recorded too, as they start, in the same
    forward (:attr:`CallArguments.around`).
    """
    import torch

    target = model.get_submodule(path)
    parts = path.split(".")
    ancestors = {model.get_submodule(".".join(parts[:depth])): ".".join(parts[:depth])
                 for depth in range(1, len(parts))}
    # Every module whose calls are counted, by path: the target's inside, or with
    # ``around`` the outermost enclosing module's, so that each enclosing call knows
    # how often its submodules ran before it began.
    counted = (model.get_submodule(parts[0]) if around and ancestors else target, parts[0]
               if around and ancestors else path)
    paths = {module: f"{counted[1]}.{name}" if name else counted[1]
             for name, module in counted[0].named_modules()}
    counts: dict[torch.nn.Module, int] = {}
    started: dict[torch.nn.Module, CallArguments] = {}
    held: list[CallArguments] = []

    def count(module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object],
              ) -> None:
        counts[module] = counts.get(module, 0) + 1
        if around and module in ancestors:
            started[module] = CallArguments(_detached(args), _detached(kwargs), (),
                                            _calls_inside(ancestors[module], paths, counts))
        if module is target and counts[module] == call + 1:
            scopes = tuple(call_name(ancestors[each], counts.get(each, 1) - 1)
                           for each in ancestors) + (call_name(path, call),)
            held.append(CallArguments(
                _detached(args), _detached(kwargs), scopes,
                _calls_inside(path, paths, counts),
                around=tuple(replace(started[each], scopes=scopes[:depth + 1])
                             for depth, each in reversed(list(enumerate(ancestors)))
                             if each in started)))
            raise _Recorded

    handles = [module.register_forward_pre_hook(count, with_kwargs=True)
               for module in {*ancestors, *paths}]
    positional, kwargs = split_keywords([to_tensor(array) for array in inputs], keywords)
    try:
        with buffers_restored(model), torch.no_grad():  # training-mode BatchNorm statistics
            model(*positional, **kwargs)
    except _Recorded:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return held[0] if held else None


def _calls_inside(path: str, paths: dict[torch.nn.Module, str],
                  counts: dict[torch.nn.Module, int]) -> dict[str, int]:
    """Path inside module ``path`` -> how many times that submodule has been called."""
    prefix = path + "."
    return {full[len(prefix):]: counts.get(module, 0) for module, full in paths.items()
            if full.startswith(prefix)}


def _detached(value: _Arguments) -> _Arguments:
    """``value`` with each tensor in it detached and copied (the same containers)."""
    import torch

    return cast("_Arguments", tree_map(lambda item: item.detach().clone()
                                       if isinstance(item, torch.Tensor) else item, value))


def trace_call(model: torch.nn.Module, path: str, arguments: CallArguments,
               known: Mapping[str, MadeFrom], elsewhere: Collection[str],
               entering: Mapping[str, np.ndarray]) -> CallOpCapture:
    """Export the call alone, map its ops onto ``known`` names, and capture their values.

    ``entering``: PyTorch's values of what the call's ONNX nodes read from outside it, by
    ONNX name; an input no op of the file names is the one of them holding its very value.

    Raises :class:`BisectOnnxError` with the reason where it cannot be done exactly,
    :class:`InputsUnnamed` where only what enters the call cannot be named.
    """
    import torch

    flat = tree_flatten((arguments.args, arguments.kwargs))[0]
    if not all(isinstance(item, torch.Tensor) for item in flat):
        raise BisectOnnxError("the call takes arguments other than tensors")
    try:
        with quiet_exporter():
            traced = torch.export.export(model.get_submodule(path), arguments.args,
                                         arguments.kwargs or None, strict=False)
    except Exception as error:
        raise BisectOnnxError(f"torch.export cannot trace it alone: {type(error).__name__}"
                              ) from error
    program = as_translated(traced)
    if program is None:
        raise BisectOnnxError("the exporter's decompositions did not run on it")
    try:
        names = map_call_names(program, path, known, elsewhere)
    except NamesRefused as error:
        raise BisectOnnxError(str(error)) from error
    arrays = [item.detach().numpy() for item in cast("list[torch.Tensor]", flat)]  # as checked
    _name_entering(program, names, arrays, entering)
    try:
        ops = capture_ops(program, arrays)
    except BisectOnnxError:
        raise
    except Exception as error:
        # torch cannot make a module of some programs traced alone (an in-place ReLU's
        # call mutates its own input: "Could not find input in either buffer or input
        # nodes"); the whole model's trace stands in for it.
        raise BisectOnnxError(f"its program cannot be run alone: {type(error).__name__}: "
                              f"{one_line(error)}") from error
    return _renamed(ops, program, names, arguments, path)


def _name_entering(program: ExportedProgram, names: CallNames, arrays: Sequence[np.ndarray],
                   entering: Mapping[str, np.ndarray]) -> None:
    """Name each input only folded ops read by the one entering value equal to it."""
    given = dict(zip(program.graph_signature.user_inputs, arrays, strict=True))
    claimed = set(names.inputs.values())
    for name in unnamed_inputs(program, names):
        array = given[name]
        equal = [value for value, held in entering.items() if value not in claimed
                 and held.shape == array.shape and held.dtype == array.dtype
                 and np.array_equal(held, array, equal_nan=True)]
        if len(equal) != 1:
            raise InputsUnnamed(f"no op of the file says which value its input {name} is, "
                                f"and {len(equal)} values entering it hold its value")
        names.inputs[name] = equal[0]
        claimed.add(equal[0])


def _renamed(ops: OpCapture, program: ExportedProgram, names: CallNames, arguments: CallArguments,
             path: str) -> CallOpCapture:
    """The capture and the program under the whole model's names and module calls."""
    # The runnable module's placeholders may be renamed (``input`` -> ``input_1``).
    users = list(program.graph_signature.user_inputs)
    if len(users) != len(ops.graph_inputs) or not set(ops.values) <= set(names.ops):
        raise BisectOnnxError("the call's runnable module names its values otherwise")
    rename = {**names.ops, **{own: names.inputs.get(user, user)
                              for own, user in zip(ops.graph_inputs, users, strict=True)}}

    def whole(name: str) -> str:
        return rename.get(name, name)

    stacks = {node.name: module_stack(node) for node in program.graph.nodes}
    values = {}
    for name, value in ops.values.items():
        scopes = arguments.scopes + tuple(_inner_scope(key, entry, path, arguments)
                                          for key, entry in stacks.get(name, {}).items()
                                          if entry[0])
        module, _, call = scopes[-1].partition("@")
        values[whole(name)] = replace(value, name=whole(name), provenance=replace(
            value.provenance, fx_node=whole(name), module=module, call=int(call or 0),
            scopes=scopes))
    in_program = {**names.ops, **names.inputs}
    for node in program.graph.nodes:
        if node.op in ("call_function", "placeholder") and node.name in in_program:
            node.name = in_program[node.name]
    return CallOpCapture(
        values=values,
        inputs_of={whole(key): tuple(map(whole, value)) for key, value in ops.inputs_of.items()},
        users_of={whole(key): tuple(map(whole, value)) for key, value in ops.users_of.items()},
        graph_inputs={whole(key): value for key, value in ops.graph_inputs.items()},
        op_names={whole(key): value for key, value in ops.op_names.items()},
        getitems={whole(key): (whole(source), index)
                  for key, (source, index) in ops.getitems.items()},
        call=arguments.scopes[-1], program=program)


def _inner_scope(key: str, entry: tuple, path: str, arguments: CallArguments) -> str:
    """A module call inside the traced call, named as the whole model names it."""
    inner = entry[0]
    return call_name(f"{path}.{inner}", arguments.inner_calls.get(inner, 0)
                     + call_of_stack_key(key))
