"""The weights of a ``torch.export`` program that an op's FX arguments stand for.

An exported program lifts parameters, buffers and tensor constants to placeholder
inputs. Both exporting an op alone (:mod:`bisect_onnx.search.decomposition`) and
rerunning it in float64 (:mod:`bisect_onnx.search.classify`) must tell such an argument
from an activation and read its tensor from the program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

__all__ = ["UnsupportedArgument", "weight_of"]


class UnsupportedArgument(Exception):
    """An op argument that is neither an activation nor a weight tensor; the message says why."""


def weight_of(arg: torch.fx.Node, program: ExportedProgram) -> tuple[str, torch.Tensor] | None:
    """``(kind, tensor)`` when ``arg`` is a parameter, buffer or lifted constant; else ``None``.

    ``kind`` is ``parameter``, ``buffer`` or ``constant``; the tensor is a detached copy.
    Raises :class:`UnsupportedArgument` for a submodule or a script object.
    """
    import torch

    if arg.op != "placeholder":
        if arg.op == "get_attr":
            raise UnsupportedArgument(f"argument {arg.name} is a get_attr node (a submodule)")
        return None
    signature = program.graph_signature
    for kind, table in (("parameter", signature.inputs_to_parameters),
                        ("buffer", signature.inputs_to_buffers),
                        ("constant", signature.inputs_to_lifted_tensor_constants)):
        if arg.name not in table:
            continue
        target = table[arg.name]
        # Non-persistent buffers live in ``constants``, not in the state dict.
        value = program.state_dict.get(target)
        if value is None:
            value = program.constants.get(target)
        if not isinstance(value, torch.Tensor):
            raise UnsupportedArgument(f"the program holds no tensor for {kind} {target}")
        return kind, value.detach().clone()
    if arg.name in signature.inputs_to_lifted_custom_objs:
        raise UnsupportedArgument(f"argument {arg.name} is a script object, not a tensor")
    return None
