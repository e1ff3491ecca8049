"""PyTorch's side of a module-level segment, rerun in float64 without tracing.

Classifying a culprit (the exporter's graph or the runtime's kernel) takes its segment
rerun in float64 on both sides. At op level the program gives PyTorch's side op by
op; at module level, in a file exported elsewhere, there is no program, and tracing
one costs seconds. The segment's inputs are values module level compared (what a
module call returned or was given), so a module call enclosing them is rerun in
float64 instead: its arguments recorded, with those of the calls around it, in one
forward stopped where the segment's output call starts, its
weights promoted, and each *pinned* value replaced, where its call hands it on, by
PyTorch's float32 value promoted (the very inputs the ONNX side is fed). What the
segment's output call returns is PyTorch's float64 value of the segment.

A value the segment does not read must not reach that result, or the two sides would
compute from different inputs: the enclosing call's floating arguments that are not
pinned are fed NaN, and a result with a NaN that PyTorch's value lacks is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard, cast

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.pytorch.call_program import CallArguments, record_call
from bisect_onnx.pytorch.calls import call_name, split_call_name
from bisect_onnx.pytorch.module_side import buffers_restored
from bisect_onnx.pytorch.private_apis import tree_flatten, tree_unflatten

if TYPE_CHECKING:
    import torch

__all__ = ["Pin", "span_in_float64", "MAX_FLOAT64_BYTES"]

logger = logging.getLogger(__name__)

#: The most a rerun's float64 copy of the enclosing call's weights may take: past it the
#: culprit stays unclassified rather than double a large model's memory.
MAX_FLOAT64_BYTES = 2 << 30


@dataclass(frozen=True, eq=False)  # by identity: the arrays are not hashable
class Pin:
    """A segment input: the module call that hands it on, and PyTorch's float32 value."""

    path: str
    call: int
    array: np.ndarray
    given: bool = False
    """``True``: the value the call is given (its one tensor argument); else its output."""
    suffix: str = ""
    """Which tensor of what the call returns: ``[0]`` for the first of a tuple (as
    module level names a call's values); ``""``: the one tensor it returns."""


def span_in_float64(model: torch.nn.Module, inputs: Sequence[np.ndarray],
                    keywords: Sequence[str], *, output: tuple[str, int], pins: Sequence[Pin],
                    reference: np.ndarray, max_bytes: int = MAX_FLOAT64_BYTES) -> np.ndarray:
    """PyTorch's float64 value of what call ``output`` returns, computed from ``pins``.

    ``reference``: PyTorch's float32 value of it (a NaN only the rerun has means the
    result read something no pin gives). Raises :class:`BisectOnnxError` with the
    reason where that cannot be done exactly.
    """
    held = record_call(model, inputs, keywords, *output, around=True)
    if held is None:
        raise BisectOnnxError(f"module call {call_name(*output)} did not run")
    # The innermost call around the output whose inside, or arguments, give every pin.
    for arguments in (held, *held.around):
        path, call = split_call_name(arguments.scopes[-1])
        plan = _plan(path, arguments, pins)
        if plan is not None:
            break
    else:
        raise BisectOnnxError("no module call around it is given, or computes, every "
                              "input of the segment")
    result = _rerun(model.get_submodule(path), path, arguments, plan, output, max_bytes)
    if result.shape != np.shape(reference):
        raise BisectOnnxError(f"rerun in float64, {call_name(*output)} is shaped "
                              f"{list(result.shape)}, not {list(np.shape(reference))}")
    if np.any(np.isnan(result) & ~np.isnan(reference)):
        raise BisectOnnxError(f"rerun in float64, {call_name(*output)} reads a value of "
                              f"{call_name(path, call)} the segment does not")
    return result


@dataclass
class _Plan:
    """How the enclosing call is fed: which arguments are pins, which calls hand them on."""

    arguments: dict[int, np.ndarray]
    """Position among the call's flattened tensor arguments -> the pinned value."""
    hooked: list[Pin]


def _plan(path: str, arguments: CallArguments, pins: Sequence[Pin]) -> _Plan | None:
    """Where each pin enters call ``path``: an argument equal to it, or a call inside."""
    flat = tree_flatten((arguments.args, arguments.kwargs))[0]
    plan = _Plan({}, [])
    for pin in pins:
        equal = [index for index, item in enumerate(flat) if _holds(item, pin.array)]
        if equal:
            plan.arguments.update(dict.fromkeys(equal, pin.array))
        elif pin.path.startswith(path + "."):
            plan.hooked.append(pin)
        else:
            return None
    return plan


def _holds(item: object, array: np.ndarray) -> bool:
    import torch

    if not isinstance(item, torch.Tensor) or tuple(item.shape) != array.shape:
        return False
    try:
        held = item.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): no pin holds it
        return False
    return held.dtype == array.dtype and np.array_equal(held, array, equal_nan=True)


def _rerun(module: torch.nn.Module, path: str, arguments: CallArguments, plan: _Plan,
           output: tuple[str, int], max_bytes: int) -> np.ndarray:
    """The call in float64: weights promoted, pins fed, other floating arguments NaN."""
    import torch

    weights = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    size = sum(item.numel() * 8 for item in weights.values() if item.is_floating_point())
    if size > max_bytes:
        raise BisectOnnxError(f"{arguments.scopes[-1]}'s weights in float64 would take "
                              f"{size / 2**30:.1f} GiB")
    promoted = {name: _promoted(item) for name, item in weights.items()}
    flat, spec = tree_flatten((arguments.args, arguments.kwargs))
    fed = [torch.from_numpy(plan.arguments[index]).double() if index in plan.arguments
           else torch.full_like(item, float("nan"), dtype=torch.float64)
           if isinstance(item, torch.Tensor) and item.is_floating_point() else item
           for index, item in enumerate(flat)]
    args, kwargs = cast("tuple[tuple[object, ...], dict[str, object]]",
                        tree_unflatten(fed, spec))
    hooks = _Hooks(module, path, arguments.inner_calls, plan.hooked, output)
    try:
        with buffers_restored(module), torch.no_grad():
            returned = torch.func.functional_call(module, promoted, tuple(args), kwargs)
    except Exception as error:  # the model's own code, in a dtype it was not written for
        raise BisectOnnxError(f"{arguments.scopes[-1]} does not run in float64: "
                              f"{type(error).__name__}") from error
    finally:
        hooks.remove()
    missing = [call_name(pin.path, pin.call) for pin in plan.hooked if pin not in hooks.fed]
    if missing:
        raise BisectOnnxError(f"module call {missing[0]} did not run inside "
                              f"{arguments.scopes[-1]}")
    result = returned if output[0] == path else hooks.result
    if not isinstance(result, torch.Tensor):
        raise BisectOnnxError(f"module call {call_name(*output)} does not return one tensor")
    return result.detach().numpy()


def _promoted(item: torch.Tensor) -> torch.Tensor:
    return item.detach().double() if item.is_floating_point() else item.detach()


class _Hooks:
    """Counts the calls inside the rerun, feeds the pins, keeps the output call's result."""

    def __init__(self, module: torch.nn.Module, path: str, before: Mapping[str, int],
                 pins: Sequence[Pin], output: tuple[str, int]) -> None:
        self.fed: set[Pin] = set()
        self.result: torch.Tensor | None = None
        self.counts = dict(before)  # calls of each submodule before the rerun's call began
        self.pins: dict[tuple[str, int], list[Pin]] = {}
        for pin in pins:
            self.pins.setdefault((pin.path, pin.call), []).append(pin)
        self.output = output
        inside = {name: sub for name, sub in module.named_modules() if name}
        self.paths = {sub: f"{path}.{name}" if path else name for name, sub in inside.items()}
        self.relative = {sub: name for name, sub in inside.items()}
        self.handles = [handle for sub in inside.values() for handle in (
            sub.register_forward_pre_hook(self._before),
            sub.register_forward_hook(self._after))]

    def _key(self, sub: torch.nn.Module) -> tuple[str, int]:
        return self.paths[sub], self.counts.get(self.relative[sub], 0)

    def _before(self, sub: torch.nn.Module, args: tuple[object, ...],
                ) -> tuple[object, ...] | None:
        pin = next((pin for pin in self.pins.get(self._key(sub), ()) if pin.given), None)
        if pin is None:
            return None
        tensors = [index for index, item in enumerate(args) if _is_tensor(item)]
        if len(tensors) != 1:
            return None  # not fed: the check of fed pins refuses the rerun
        self.fed.add(pin)
        return tuple(_as_float64(pin.array) if index == tensors[0] else item
                     for index, item in enumerate(args))

    def _after(self, sub: torch.nn.Module, args: tuple[object, ...], returned: object,
               ) -> object:
        key = self._key(sub)
        self.counts[self.relative[sub]] = key[1] + 1
        replaced = None
        for pin in self.pins.get(key, ()):
            fed = None if pin.given else _with_item(returned, pin.suffix,
                                                    _as_float64(pin.array))
            if fed is not None:  # else not fed: the check of fed pins refuses the rerun
                self.fed.add(pin)
                replaced = returned = fed
        if key == self.output and _is_tensor(returned):
            self.result = returned.detach().clone()
        return replaced

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _with_item(value: object, suffix: str, tensor: torch.Tensor) -> object:
    """``value`` with its tensor at ``suffix`` (``[1][0]``) replaced; ``None`` if none is there.

    Only tuples and lists are rebuilt: a dict or a named tuple of the model's own class
    is not made anew here.
    """
    if not suffix:
        return tensor if _is_tensor(value) else None
    head, _, rest = suffix[1:].partition("]")
    sequence = cast("tuple[object, ...] | list[object]", value)  # used once it is one
    if type(value) not in (tuple, list) or not head.isdigit() or int(head) >= len(sequence):
        return None
    inner = _with_item(sequence[int(head)], rest, tensor)
    if inner is None:
        return None
    items = list(sequence)
    items[int(head)] = inner
    return type(sequence)(items)


def _is_tensor(item: object) -> TypeGuard[torch.Tensor]:
    import torch

    return isinstance(item, torch.Tensor)


def _as_float64(array: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.asarray(array, dtype=np.float64))
