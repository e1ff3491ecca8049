"""The culprit's torch op alone: its ATen target and its arguments, as Python source.

The model is traced as the dynamo exporter traces it
(:func:`~bisect_onnx.pytorch.exporting.trace_program`), whose FX node names are the
dynamo export's ONNX value names; the culprit's node is found by that name, else by
its torch op in its module. Its tensor arguments become the standalone module's
inputs (their shapes and dtypes as traced), everything else is written as the literal
the op was called with.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.pytorch.private_apis import is_op_overload

if TYPE_CHECKING:
    import torch

__all__ = ["CannotIsolate", "TensorSpec", "CulpritOp", "locate_culprit_op"]


class CannotIsolate(Exception):
    """The culprit's op cannot be written down alone; the message says why, in one line."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument of the op: its input name, shape and torch dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """``float32``, ``int64``: the ``torch.<dtype>`` attribute."""


@dataclass(frozen=True)
class CulpritOp:
    """The op a standalone repro calls: ``call`` on tensors named by ``inputs``."""

    target: str
    """``aten.avg_pool2d.default``."""
    call: str
    """``torch.ops.aten.avg_pool2d.default(input0, [2, 2], [2, 2], [0, 0], False, True, 3)``."""
    inputs: tuple[TensorSpec, ...]
    fx_name: str
    module: str | None


def locate_culprit_op(model: torch.nn.Module, args: Sequence[object],
                      kwargs: Mapping[str, object] | None = None,
                      *, value_name: str | None = None, torch_op: str | None = None,
                      module: str | None = None) -> CulpritOp:
    """The culprit's op, found in the model's trace by ONNX value name or torch op + module."""
    from bisect_onnx.pytorch.exporting import trace_program

    kwargs = dict(kwargs or {})
    arrays = [value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
              for value in (*args, *kwargs.values())]
    program = trace_program(model, arrays, tuple(kwargs))
    if program is None:
        raise CannotIsolate("torch.export cannot trace the model, so its op cannot be found")
    node = _find_node(program.graph, value_name, torch_op, module)
    return _as_call(node, module)


def _find_node(graph: torch.fx.Graph, value_name: str | None, torch_op: str | None,
               module: str | None) -> torch.fx.Node:
    """The FX node named ``value_name``, else the first calling ``torch_op`` in ``module``."""
    calls = [node for node in graph.nodes if node.op == "call_function"]
    for node in calls:
        if value_name is not None and node.name == value_name:
            return node
    if torch_op is not None:
        for node in calls:
            if _target_name(node.target) == torch_op and (module is None or
                                                          _in_module(node, module)):
                return node
    if module is not None:  # a module of one op (a TorchScript export names no FX node)
        inside = [node for node in calls if node.target is not operator.getitem
                  and _in_module(node, module)]
        if len(inside) == 1:
            return inside[0]
    raise CannotIsolate(f"no op of the traced model is the culprit (value {value_name!r}, "
                        f"op {torch_op!r}, module {module!r})")


def _in_module(node: torch.fx.Node, module: str) -> bool:
    """Whether the node ran in module path ``module`` (``relu@1`` is its second call)."""
    paths = [entry[0] for entry in (node.meta.get("nn_module_stack") or {}).values()
             if isinstance(entry, tuple) and entry]
    return bool(paths) and paths[-1] == module.split("@")[0]


def _target_name(target: object) -> str:
    """``aten.avg_pool2d.default`` for an OpOverload (its ``str``)."""
    return str(target)


def _as_call(node: torch.fx.Node, module: str | None) -> CulpritOp:
    """The node's op as source: ``torch.ops.<target>(...)``, ``[i]`` for a getitem."""
    import torch

    index = None
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        index, node_called = node.args[1], node.args[0]
    else:
        node_called = node
    target = node_called.target
    if not is_op_overload(target):
        raise CannotIsolate(f"the culprit {node.name} calls {target!r}, not an ATen op")
    inputs: dict[str, TensorSpec] = {}

    def source(item: object) -> str:
        if isinstance(item, torch.fx.Node):
            if item.name not in inputs:
                inputs[item.name] = _spec(item, f"input{len(inputs)}")
            return inputs[item.name].name
        return _literal(item, source)

    arguments = [source(item) for item in node_called.args]
    arguments += [f"{name}={source(item)}" for name, item in node_called.kwargs.items()]
    call = f"torch.ops.{_target_name(target)}({', '.join(arguments)})"
    if index is not None:
        call += f"[{index!r}]"
    return CulpritOp(_target_name(target), call, tuple(inputs.values()), node.name, module)


def _spec(node: torch.fx.Node, name: str) -> TensorSpec:
    """The traced shape and dtype of a tensor argument."""
    import torch

    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise CannotIsolate(f"argument {node.name} of the culprit is a "
                            f"{type(value).__name__}, not a tensor of known shape")
    try:
        shape = tuple(int(size) for size in value.shape)
    except (TypeError, ValueError) as error:  # a symbolic size
        raise CannotIsolate(f"argument {node.name} has a symbolic shape "
                            f"{list(value.shape)}") from error
    return TensorSpec(name, shape, str(value.dtype).removeprefix("torch."))


def _literal(item: object, source: Callable[[object], str]) -> str:
    """A non-tensor argument as Python source (lists of nodes through ``source``)."""
    import torch

    if item is None or isinstance(item, (bool, int, str)):
        return repr(item)
    if isinstance(item, float):
        return repr(item) if np.isfinite(item) else f"float({str(item)!r})"
    if isinstance(item, (list, tuple)):
        inner = ", ".join(source(each) for each in item)
        if isinstance(item, list):
            return f"[{inner}]"
        return f"({inner}{',' if len(item) == 1 else ''})"
    if isinstance(item, (torch.dtype, torch.memory_format, torch.layout)):
        return str(item)  # torch.float32, torch.contiguous_format, torch.strided
    if isinstance(item, torch.device):
        return f"torch.device({str(item)!r})"
    raise CannotIsolate(f"the culprit's op takes a {type(item).__name__} argument, which a "
                        "standalone script cannot restate")
