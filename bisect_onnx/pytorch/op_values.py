"""The op-level reference: the value of every FX node of an ExportedProgram.

The dynamo exporter names ONNX values after the FX nodes of the program *after* its
decompositions (``ONNXProgram.exported_program``), so running that program node by
node gives a torch value for nearly every ONNX value, by name. Each value keeps the
ATen op, the module calls around it (from ``nn_module_stack``) and the user's source
line (from the node's stack trace), which is what an exporter bug report needs.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import ModelError, one_line
from bisect_onnx.graph.provenance import Provenance, user_source
from bisect_onnx.pytorch.calls import call_name, call_of_stack_key
from bisect_onnx.pytorch.module_side import describe_arrays, to_tensor
from bisect_onnx.pytorch.program_side import module_stack, op_name, recorder_class
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

__all__ = ["OpCapture", "capture_ops"]

logger = logging.getLogger(__name__)


@dataclass
class OpCapture:
    """Every tensor an ExportedProgram's ops computed on one input, by FX node name."""

    values: dict[str, CapturedValue]
    """FX node name -> its value; single-tensor ``call_function`` nodes, graph order."""
    inputs_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """FX node name -> names of the nodes it reads (every call_function node)."""
    users_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """FX node name -> names of the nodes that read it."""
    graph_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    """The user inputs (placeholders) by FX name."""
    op_names: dict[str, str] = field(default_factory=dict)
    """FX node name -> ATen op (``aten.linear.default``), for every call_function node."""
    getitems: dict[str, tuple[str, int]] = field(default_factory=dict)
    """``getitem`` node name -> (the tuple-valued node it reads, the index)."""


def capture_ops(program: ExportedProgram, inputs: Sequence[np.ndarray]) -> OpCapture:
    """Run ``program`` on ``inputs`` and copy the value of every op as it is computed."""
    import torch

    module = program.module()
    graph = module.graph
    wanted = {node for node in graph.nodes if node.op == "call_function"}
    recorder = recorder_class()(module, wanted)
    tensors = [to_tensor(array) for array in inputs]
    buffers = {name: buffer.clone() for name, buffer in module.named_buffers()}
    try:
        with torch.no_grad():
            recorder.run(*tensors)
    except Exception as error:
        raise ModelError(
            f"the exported program raised {type(error).__name__} on inputs "
            f"{describe_arrays(inputs)}: {one_line(error)}"
        ) from error
    finally:  # a program in training mode updates its BatchNorm statistics
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                buffer.copy_(buffers[name])

    capture = OpCapture(values={})
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    for node, array in zip(placeholders, inputs, strict=False):
        capture.graph_inputs[node.name] = np.asarray(array)
    for position, node in enumerate(graph.nodes):
        if node.op != "call_function":
            continue
        capture.inputs_of[node.name] = tuple(source.name for source in node.all_input_nodes)
        capture.users_of[node.name] = tuple(user.name for user in node.users)
        capture.op_names[node.name] = op_name(node) or _callable_name(node.target)
        if node.target is operator.getitem and isinstance(node.args[1], int):
            capture.getitems[node.name] = (node.args[0].name, node.args[1])
        copies = recorder.copies.get(node, [])
        # A tuple-valued op (max_pool2d_with_indices) is read through its getitems,
        # which are nodes (and ONNX values) of their own.
        if len(copies) == 1 and copies[0][0] == "":
            capture.values[node.name] = CapturedValue(
                name=node.name, array=copies[0][1], provenance=_provenance(node, position))
    logger.info("recorded %d op values from %d ops", len(capture.values), len(wanted))
    return capture


def _provenance(node: Node, position: int) -> Provenance:
    scopes = []
    path, call, module_class = "", 0, None
    for key, (path, qualified) in module_stack(node).items():
        if path == "":
            continue
        call = call_of_stack_key(key)
        module_class = str(qualified).rsplit(".", 1)[-1]
        scopes.append(call_name(path, call))
    return Provenance(
        position=position,
        module=path if scopes else "",
        call=call if scopes else 0,
        module_class=module_class,
        torch_op=_torch_op(node),
        source=user_source(node.meta.get("stack_trace") or ""),
        fx_node=node.name,
        scopes=tuple(scopes),
    )


def _torch_op(node: Node) -> str:
    """The ATen op; for a getitem, the op whose tuple it reads (BatchNorm's, say)."""
    if node.target is operator.getitem and node.all_input_nodes:
        source = node.all_input_nodes[0]
        if source.op == "call_function" and op_name(source):
            return op_name(source)
    return op_name(node) or _callable_name(node.target)


def _callable_name(target: object) -> str:
    """``operator.getitem`` and the like: not ATen ops, but named all the same."""
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else name
