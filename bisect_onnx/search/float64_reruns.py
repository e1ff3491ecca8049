"""The culprit rerun in float64 on both sides: exact arithmetic's stand-in.

:func:`torch_op_in_float64` reruns the torch op with float64 tensors,
:func:`onnx_segment_in_float64` runs the ONNX segment with ``onnx.reference`` with every
float made double; :func:`bisect_onnx.search.classify.classify` decides from what they
give. Either returns ``None`` where its side cannot be run that way, and the debug log
says why.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import one_line
from bisect_onnx.search.program_weights import UnsupportedArgument, weight_of

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["onnx_segment_in_float64", "torch_op_in_float64"]

logger = logging.getLogger(__name__)

# Cast targets and dtypes rewritten to double. The float8 and float4 types are left
# alone: a cast to them is a deliberate quantization, part of what the graph means.
_PROMOTED_TYPES = frozenset({1, 10, 16})  # FLOAT, FLOAT16, BFLOAT16
_DOUBLE = 11


class _CannotRun(Exception):
    """The op or segment cannot be run in float64; the message says why, in one line."""


def torch_op_in_float64(
    fx_node: torch.fx.Node,
    program: ExportedProgram,
    reference_values: Mapping[str, np.ndarray],
) -> np.ndarray | None:
    """Run the FX node's target with every floating tensor argument cast to float64.

    Activations come from ``reference_values`` (PyTorch's values by FX node name),
    weights from ``program``; a floating ``dtype`` argument (``aten.to``, ``aten.full``)
    becomes float64 too. An ``operator.getitem`` node re-runs the op it picks from.
    ``None`` when the op cannot be run that way (a non-float result, an argument that
    cannot be resolved, the op refusing float64); the debug log says why.
    """
    import torch

    try:
        result = _run_in_float64(fx_node, program, reference_values)
    except (_CannotRun, UnsupportedArgument) as error:
        logger.debug("cannot re-run %s in float64: %s", fx_node.name, error)
        return None
    except Exception as error:  # an op refusing float64 is the model's business, not a bug
        logger.debug("re-running %s in float64 failed: %s", fx_node.name, one_line(error),
                     exc_info=True)
        return None
    if not isinstance(result, torch.Tensor):
        logger.debug("cannot re-run %s in float64: it returns a %s, not a tensor", fx_node.name,
                     type(result).__name__)
        return None
    if result.dtype != torch.float64:
        logger.debug("cannot re-run %s in float64: it computes %s even from float64 inputs",
                     fx_node.name, result.dtype)
        return None
    return result.detach().numpy()


def _run_in_float64(fx_node: torch.fx.Node, program: ExportedProgram,
                    reference_values: Mapping[str, np.ndarray]) -> Any:
    """The op's raw result (a tensor, a tuple of them, ...) on float64 arguments."""
    import torch
    from torch.fx.node import map_aggregate

    if fx_node.op != "call_function":
        raise _CannotRun(f"{fx_node.name} is a {fx_node.op} node, not an op call")
    if fx_node.target is operator.getitem and isinstance(fx_node.args[0], torch.fx.Node):
        # The tuple an op returns has no reference value of its own: re-run the op.
        return _run_in_float64(fx_node.args[0], program, reference_values)[fx_node.args[1]]

    def promote(item: Any) -> Any:
        if isinstance(item, torch.dtype):
            return torch.float64 if item.is_floating_point else item
        if not isinstance(item, torch.fx.Node):
            return item
        weight = weight_of(item, program)
        if weight is not None:
            tensor = weight[1]
        else:
            value = reference_values.get(item.name)
            if isinstance(value, (bool, int, float)):
                return value  # a symbolic size, say
            if not isinstance(value, np.ndarray):
                raise _CannotRun(f"argument {item.name} has no reference array"
                                 + ("" if value is None else f" (a {type(value).__name__})"))
            tensor = torch.from_numpy(np.array(value))  # a copy: the op may not write into it
        return tensor.to(torch.float64) if tensor.is_floating_point() else tensor

    args, kwargs = map_aggregate((fx_node.args, fx_node.kwargs), promote)
    with torch.no_grad():
        return fx_node.target(*args, **kwargs)


def onnx_segment_in_float64(
    segment: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    output: str,
) -> np.ndarray | None:
    """Evaluate ``segment`` with ``onnx.reference``, every float made float64; ``output``'s value.

    Float32, float16 and bfloat16 feeds, initializers, tensor attributes (Constant
    values) and value types become double, as do Cast targets and ``dtype``
    attributes, so that no node drops back to a narrower float; the caller's model is
    left as it is. Weights must be inside the model (external data embedded).
    ``None`` when the evaluator cannot run it (a contrib op such as com.microsoft
    FusedConv) or ``output`` is not a float; the debug log says why.
    """
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.ModelProto()
    model.CopyFrom(segment)
    try:
        _promote_graph(model.graph)
        for function in model.functions:
            for node in function.node:
                _promote_node(node)
        promoted = {name: _promote_array(np.asarray(value)) for name, value in feeds.items()}
        result = ReferenceEvaluator(model).run([output], promoted)[0]
    except _CannotRun as error:
        logger.debug("cannot evaluate the segment for %s in float64: %s", output, error)
        return None
    except Exception as error:  # an op the evaluator lacks is the model's business, not a bug
        logger.debug("onnx.reference cannot evaluate the segment for %s in float64: %s", output,
                     one_line(error), exc_info=True)
        return None
    result = np.asarray(result)
    if result.dtype != np.float64:
        logger.debug("the segment computes %s as %s even in float64: not a float value, or a "
                     "node the rewrite missed", output, result.dtype)
        return None
    return result


def _promote_array(array: np.ndarray) -> np.ndarray:
    if np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16":
        return array.astype(np.float64)
    return array


def _promote_graph(graph: onnx.GraphProto) -> None:
    """Rewrite ``graph`` (and its subgraphs) in place so that every float is double."""
    for tensor in graph.initializer:
        _promote_tensor(tensor)
    for sparse in graph.sparse_initializer:
        _promote_tensor(sparse.values)
    for value in (*graph.input, *graph.output, *graph.value_info):
        _promote_type(value.type)
    for node in graph.node:
        _promote_node(node)


def _promote_node(node: onnx.NodeProto) -> None:
    import onnx

    default_domain = node.domain in ("", "ai.onnx")
    if default_domain and node.op_type == "Constant":
        for attribute in node.attribute:
            if attribute.name in ("value_float", "value_floats"):
                # These hold float32 by definition: turn them into a double tensor.
                values = attribute.f if attribute.name == "value_float" else list(attribute.floats)
                tensor = onnx.numpy_helper.from_array(np.asarray(values, dtype=np.float64))
                attribute.CopyFrom(onnx.helper.make_attribute("value", tensor))
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            _promote_tensor(attribute.t)
        elif attribute.type == onnx.AttributeProto.TENSORS:
            for tensor in attribute.tensors:
                _promote_tensor(tensor)
        elif attribute.type == onnx.AttributeProto.GRAPH:
            _promote_graph(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _promote_graph(graph)
        elif (default_domain and attribute.type == onnx.AttributeProto.INT
              and (attribute.name == "dtype" or (node.op_type == "Cast" and attribute.name == "to"))
              and attribute.i in _PROMOTED_TYPES):
            attribute.i = _DOUBLE


def _promote_tensor(tensor: onnx.TensorProto) -> None:
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    if tensor.data_type not in _PROMOTED_TYPES:
        return
    if uses_external_data(tensor):
        raise _CannotRun(f"weight {tensor.name!r} keeps its data outside the model; embed it "
                         "first (bisect_onnx.graph.segments.embed_external_data)")
    promoted = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64),
                                       tensor.name)
    tensor.CopyFrom(promoted)


def _promote_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type in _PROMOTED_TYPES:
            inner.elem_type = _DOUBLE
    elif kind in ("sequence_type", "optional_type"):
        _promote_type(getattr(type_proto, kind).elem_type)
