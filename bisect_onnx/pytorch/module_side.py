"""The PyTorch reference side: forward hooks record every module call's output.

Each output is copied the moment the hook fires, because a later in-place op (a
``ReLU(inplace=True)`` right after a conv) would otherwise change it under us.
What enters each call is recorded too (by a pre-hook, before an in-place module
writes over it): a value computed between two modules (``F.gelu`` in a ``forward``,
an in-place view edit) has no module of its own, and is compared where the next
module reads it.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from bisect_onnx.errors import InputError, ModelError, one_line
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.vocabulary import ReportWarning
from bisect_onnx.pytorch.calls import call_name, input_name
from bisect_onnx.pytorch.private_apis import version_counter
from bisect_onnx.runtime.sides import Capture, CapturedValue, JsonObject

if TYPE_CHECKING:
    import torch

__all__ = ["TorchModuleSide", "flatten_outputs", "training_mode_warning", "in_training_mode",
           "describe_arrays",
           "to_tensor", "to_numpy", "same_tensor", "split_keywords", "buffers_restored",
           "model_untouched",
           "final_outputs"]

logger = logging.getLogger(__name__)

_Value = TypeVar("_Value")

# Module types whose behaviour changes between train and eval mode: the usual
# reason a model left in training mode disagrees with its (eval-mode) export.
_MODE_DEPENDENT = ("BatchNorm", "Dropout", "InstanceNorm", "GroupNorm", "AlphaDropout")


class TorchModuleSide:
    """Runs an ``nn.Module`` eagerly and records the output of every module call."""

    def __init__(self, model: torch.nn.Module, *, label: str | None = None) -> None:
        import torch

        self.model = model
        self.label = label or type(model).__name__
        # ScriptModules support no forward hooks: only their final outputs can be had.
        self.records_modules = not isinstance(model, torch.jit.ScriptModule)

    def describe(self) -> JsonObject:
        """What this side is, for the report."""
        return {
            "kind": "torch",
            "model": self.label,
            "class": type(self.model).__name__,
            "training": bool(self.model.training),
        }

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Run the model once on ``inputs`` with a forward hook on every submodule."""
        import torch

        modules = self.model.named_modules() if self.records_modules else ()
        # The model itself is left out: its output is the final output, compared apart.
        recorder = _CallRecorder({module: path for path, module in modules if path})
        args, kwargs = split_keywords([to_tensor(array) for array in inputs], keywords)
        handles = [module.register_forward_hook(recorder) for module in recorder.paths]
        handles += [module.register_forward_pre_hook(recorder.record_inputs)
                    for module in recorder.paths]
        try:
            # A model in training mode updates its BatchNorm statistics as it runs: put
            # them back, so that comparing leaves the user's model as it was.
            with buffers_restored(self.model), torch.no_grad():
                result = self.model(*args, **kwargs)
        except Exception as error:
            mismatch = _dtype_mismatch(self.model, inputs)
            if mismatch:  # the usual reason: a float64 array saved for a float32 model
                position, dtype, weights = mismatch
                raise InputError(
                    f"input {position} is {dtype} but the model's weights are {weights}, and "
                    f"forward raised {type(error).__name__}: {one_line(error)}; convert the "
                    f"input with .astype(numpy.{weights})") from error
            raise ModelError(
                f"the PyTorch model's forward raised {type(error).__name__} on inputs "
                f"{describe_arrays(inputs)}: {one_line(error)}; check that the inputs "
                "are the ones forward expects"
            ) from error
        finally:
            for handle in handles:
                handle.remove()
        logger.info("recorded %d module outputs from %d module calls", len(recorder.values),
                    sum(recorder.calls.values()))
        return Capture(values=recorder.values,
                       outputs=final_outputs(result, type(self.model).__name__))


def _dtype_mismatch(model: torch.nn.Module,
                    inputs: Sequence[np.ndarray]) -> tuple[int, np.dtype, str] | None:
    """The first floating input whose dtype is not the model's weights', with theirs.

    Only where the floating weights agree on one dtype numpy has: a mixed-precision
    model may take either, and no numpy array can be bfloat16.
    """
    dtypes = {str(tensor.dtype).removeprefix("torch.")
              for tensor in [*model.parameters(), *model.buffers()] if tensor.is_floating_point()}
    if len(dtypes) != 1 or not dtypes <= {"float16", "float32", "float64"}:
        return None
    (weights,) = dtypes
    for position, array in enumerate(inputs):
        dtype = np.asarray(array).dtype
        if dtype.kind == "f" and dtype.name != weights:
            return position, dtype, weights
    return None


class _CallRecorder:
    """The forward hook :meth:`TorchModuleSide.run` puts on every submodule.

    Each call's output is copied as the hook fires, unless it is the very tensor
    recorded last, unchanged since: then the copy is shared.
    """

    def __init__(self, paths: dict[torch.nn.Module, str]) -> None:
        self.paths = paths
        self.calls: dict[str, int] = {}
        self.values: dict[str, CapturedValue] = {}
        # The live tensor behind each recorded value, to recognise a module that hands
        # its input back unchanged; weak, so that recording keeps nothing alive.
        self.recorded: dict[str, weakref.ref] = {}
        # The version each recorded tensor had then: a block's output is often the very
        # tensor its last submodule returned, unchanged since, whose copy can be shared.
        self.versions: dict[str, int | None] = {}
        self.latest: dict[tuple, str] = {}  # (storage, shape, strides, dtype) -> last recorded

    def record_inputs(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        """The pre-hook: copy each distinct tensor argument of the call about to run.

        A tensor recorded before and unchanged since (the previous module's output)
        shares that copy, so recording inputs costs memory only for the values no
        module returned.
        """
        path = self.paths[module]
        call = self.calls.get(path, 0)
        tensors: list[torch.Tensor] = []
        for _, tensor in flatten_outputs(tuple(args)):
            if not any(same_tensor(seen, tensor) for seen in tensors):
                tensors.append(tensor)
        for index, tensor in enumerate(tensors):
            self._record(input_name(call_name(path, call), index, len(tensors)), tensor,
                         Provenance(position=len(self.values), module=path, call=call,
                                    module_class=type(module).__name__))

    def __call__(self, module: torch.nn.Module, args: tuple[object, ...], output: object,
                 ) -> None:
        path = self.paths[module]
        call = self.calls.get(path, 0)
        self.calls[path] = call + 1
        base = call_name(path, call)
        for suffix, tensor in flatten_outputs(output):
            name = base + suffix
            earlier = _latest_record(tensor, self.recorded, self.latest)
            version = version_counter(tensor)
            array = (self.values[earlier].array
                     if earlier and version is not None and self.versions[earlier] == version
                     else to_numpy(tensor))
            self.values[name] = CapturedValue(
                name=name,
                array=array,
                provenance=Provenance(
                    position=len(self.values),
                    module=path,
                    call=call,
                    module_class=type(module).__name__,
                    same_as=_passed_through(tensor, array, args, earlier, self.values),
                ),
            )
            self.recorded[name] = weakref.ref(tensor)
            self.versions[name] = version
            self.latest[_tensor_key(tensor)] = name

    def _record(self, name: str, tensor: torch.Tensor, provenance: Provenance) -> None:
        """Record ``tensor`` under ``name``, sharing the copy of an unchanged earlier record."""
        earlier = _latest_record(tensor, self.recorded, self.latest)
        version = version_counter(tensor)
        shared = earlier and version is not None and self.versions[earlier] == version
        if shared:  # a module output seen again: it stays the record to pass through
            self.values[name] = CapturedValue(name=name, array=self.values[earlier].array,
                                              provenance=provenance)
            return
        self.values[name] = CapturedValue(name=name, array=to_numpy(tensor),
                                          provenance=provenance)
        self.recorded[name] = weakref.ref(tensor)
        self.versions[name] = version
        self.latest[_tensor_key(tensor)] = name


@contextlib.contextmanager
def buffers_restored(module: torch.nn.Module) -> Iterator[None]:
    """Put the module's buffers (BatchNorm statistics...) back as they were on leaving."""
    import torch

    buffers = {name: buffer.clone() for name, buffer in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                buffer.copy_(buffers[name])


@contextlib.contextmanager
def model_untouched(model: object) -> Iterator[None]:
    """The user's module as it came in on leaving: its buffers, and each module's mode.

    A run needs the model to run (in training mode a BatchNorm updates its statistics
    as it goes): whichever step ran it, what it changed is put back here, once, for
    the whole run. Only the buffers of modules in training mode are kept aside: a
    module in eval mode does not update its own, and a large model (in eval mode, as
    most are) is not held twice for the run. Anything but an ``nn.Module`` (a program,
    a path) is left as it is.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        yield
        return
    modes = [(module, module.training) for module in model.modules()]
    buffers = {name: buffer.clone() for prefix, module in model.named_modules()
               if module.training
               for name, buffer in module.named_buffers(prefix=prefix, recurse=False)}
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training  # not train(): it would recurse
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                # A buffer released at the end (the CLI's own model, whose weights were
                # parked and let go: empty now) has nothing to be put back into.
                if name in buffers and buffer.shape == buffers[name].shape:
                    buffer.copy_(buffers[name])


def final_outputs(result: object, model_class: str) -> list[CapturedValue]:
    """The model's own outputs (``output``, ``output[0]``...), copied, in order."""
    return [
        CapturedValue(
            name=f"output{suffix}",
            array=to_numpy(tensor),
            provenance=Provenance(position=index, module="", module_class=model_class),
        )
        for index, (suffix, tensor) in enumerate(flatten_outputs(result))
    ]


def _tensor_key(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


def _latest_record(tensor: torch.Tensor, recorded: dict[str, weakref.ref],
                   latest: dict[tuple, str]) -> str | None:
    """The value last recorded from this very tensor (or an identical view), if alive."""
    name = latest.get(_tensor_key(tensor))
    if name is None:
        return None
    source = recorded[name]()
    return name if source is not None and same_tensor(source, tensor) else None


def _passed_through(tensor: torch.Tensor, array: np.ndarray, args: Sequence[object],
                    earlier: str | None, values: dict[str, CapturedValue]) -> str | None:
    """The recorded value a module returned unchanged as its output, if it did.

    The output must be the input tensor itself (or an identical view of it) *and* still
    hold the values recorded for it (``earlier``): an in-place ReLU also returns its
    input, changed.
    """
    if earlier is None or not any(same_tensor(arg, tensor) for arg in args):
        return None
    recorded = values[earlier].array
    if recorded is array:  # the copy is shared: nothing has written to the tensor since
        return earlier
    if version_counter(tensor) is not None:  # written to since (an in-place ReLU): changed
        return None
    if recorded.shape == array.shape and np.array_equal(recorded, array, equal_nan=True):
        return earlier
    return None


def same_tensor(candidate: object, tensor: torch.Tensor) -> bool:
    """Whether ``candidate`` is ``tensor`` or an identical view of the same memory."""
    import torch

    if candidate is tensor:
        return True
    return (
        isinstance(candidate, torch.Tensor)
        and candidate.data_ptr() == tensor.data_ptr()
        and candidate.shape == tensor.shape
        and candidate.stride() == tensor.stride()
        and candidate.dtype == tensor.dtype
    )


def flatten_outputs(output: object, suffix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(suffix, tensor)`` for every tensor in a nested output, in order.

    A lone tensor has the suffix ``""``; a tuple element ``[0]``; a dict (including
    Hugging Face ``ModelOutput``) entry ``[key]``. Non-tensors (``None``, ints) are
    skipped: the exporter turns them into constants, not graph outputs.
    """
    import torch

    if isinstance(output, torch.Tensor):
        yield suffix, output
    elif isinstance(output, dict):
        for key, item in output.items():
            yield from flatten_outputs(item, f"{suffix}[{key}]")
    elif isinstance(output, (list, tuple)):
        for index, item in enumerate(output):
            yield from flatten_outputs(item, f"{suffix}[{index}]")


def in_training_mode(model: object) -> dict[str, str]:
    """The mode-dependent modules (Dropout, BatchNorm...) left in training mode, by path.

    Path -> class name; empty for anything that is not an ``nn.Module``.
    """
    if not hasattr(model, "named_modules"):
        return {}
    return {path: _class_name(module) for path, module in model.named_modules()
            if module.training and any(kind in _class_name(module) for kind in _MODE_DEPENDENT)}


def training_mode_warning(model: torch.nn.Module) -> str | None:
    """A warning naming the train-mode modules likely to explain a divergence."""
    suspects = [f"{path} ({kind})" for path, kind in in_training_mode(model).items()]
    if not suspects:
        return None
    shown = ", ".join(suspects[:6])
    if len(suspects) > 6:
        shown += f" and {len(suspects) - 6} more"
    return TRAINING_MODE.format(modules=shown)


TRAINING_MODE = ReportWarning(
    "training-mode",
    "the model is in training mode: {modules} behave differently in training and eval; "
    "this is a likely cause of any divergence — call model.eval() before comparing if "
    "you meant inference (bisect-onnx leaves the mode as given)")


def split_keywords(values: Sequence[_Value], keywords: Sequence[str],
                   ) -> tuple[list[_Value], dict[str, _Value]]:
    """Positional values, and the trailing ones named by ``keywords`` as a dict."""
    cut = len(values) - len(keywords)
    return list(values[:cut]), dict(zip(keywords, values[cut:], strict=True))


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor of the array's values (0-d stays 0-d, unlike ``np.ascontiguousarray``)."""
    import torch

    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _class_name(module: torch.nn.Module) -> str:
    # A TorchScript module's type is RecursiveScriptModule; its source class is kept.
    return getattr(module, "original_name", None) or type(module).__name__


def describe_arrays(arrays: Sequence[np.ndarray]) -> str:
    """``float32[1,3,32,32], int64[2]`` — a compact description for messages."""
    return ", ".join(f"{np.asarray(a).dtype}[{','.join(map(str, np.shape(a)))}]" for a in arrays)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A copy of the tensor's values, taken now (later in-place ops cannot change it)."""
    import torch

    copied = tensor.detach().to("cpu")
    if copied.dtype == torch.bfloat16:  # numpy has no bfloat16
        copied = copied.float()
    return copied.clone().numpy()
