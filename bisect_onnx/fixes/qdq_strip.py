"""Leaving nodes of a QDQ model unquantized, in a copy: their Q/DQ pairs removed.

A node left unquantized reads, for each input that came through a DequantizeLinear,
the float value from before the matching QuantizeLinear; a weight's DequantizeLinear is
replaced by the float weight (the reference's, by name, where it has one; otherwise the
dequantized values). Q/DQ nodes nobody reads any more are dropped.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["without_qdq"]

_WEIGHT_SUFFIXES = ("_quantized", "_DequantizeLinear_Output")

_T = onnx.TensorProto
#: The range a QuantizeLinear saturates to, by its zero point's type.
_INTEGER_RANGES = {_T.INT8: (-128, 127), _T.UINT8: (0, 255), _T.INT16: (-32768, 32767),
                   _T.UINT16: (0, 65535), _T.INT4: (-8, 7), _T.UINT4: (0, 15)}


def without_qdq(model: onnx.ModelProto, nodes: Collection[str],
                reference: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """A copy of ``model`` in which the named nodes read float values."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    producer = {out: node for node in graph.node for out in node.output}
    weights = {t.name: t for t in graph.initializer}
    float_weights = {t.name: t for t in (reference.graph.initializer if reference else [])}
    for node in graph.node:
        if node.name not in nodes:
            continue
        for index, name in enumerate(node.input):
            dequantize = producer.get(name)
            if dequantize is None or dequantize.op_type != "DequantizeLinear":
                continue
            quantize = producer.get(dequantize.input[0])
            if quantize is not None and quantize.op_type == "QuantizeLinear":
                node.input[index] = _saturated(graph, quantize, weights)
            elif dequantize.input[0] in weights:
                tensor = _float_weight(dequantize, weights, float_weights)
                graph.initializer.append(tensor)
                node.input[index] = tensor.name
    _clips_after_their_input(graph)
    _drop_unread(graph)
    return copy


def _clips_after_their_input(graph: onnx.GraphProto) -> None:
    """Move each added Clip right after the node producing its input (topological order)."""
    nodes = [node for node in graph.node if not node.name.endswith("__saturated_clip")]
    for clip in (node for node in graph.node if node.name.endswith("__saturated_clip")):
        at = next((i + 1 for i, node in enumerate(nodes) if clip.input[0] in node.output), 0)
        nodes.insert(at, clip)
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def _saturated(graph: onnx.GraphProto, quantize: onnx.NodeProto, weights) -> str:
    """The activation clipped to the range its QuantizeLinear saturates to, unrounded.

    quantize_static folds a Relu (or Clip) into the quantizer's range and drops the node,
    so bypassing the pair alone would also drop the Relu; the Clip keeps it.
    """
    scale = weights.get(quantize.input[1])
    zero = weights.get(quantize.input[2]) if len(quantize.input) > 2 and quantize.input[2] \
        else None
    # Without a zero point the output is uint8; a float8 or unknown type is not clipped.
    limits = _INTEGER_RANGES.get(zero.data_type if zero is not None else onnx.TensorProto.UINT8)
    if scale is None or limits is None or (scale.dims and np.prod(scale.dims) != 1):
        return quantize.input[0]
    step = float(numpy_helper.to_array(scale).reshape(-1)[0])
    offset = float(numpy_helper.to_array(zero).reshape(-1)[0]) if zero is not None else 0.0
    low, high = (limits[0] - offset) * step, (limits[1] - offset) * step
    name = f"{quantize.input[0]}__saturated"
    if name not in {out for node in graph.node for out in node.output}:
        graph.initializer.extend([numpy_helper.from_array(np.float32(low), f"{name}_min"),
                                  numpy_helper.from_array(np.float32(high), f"{name}_max")])
        graph.node.append(onnx.helper.make_node(
            "Clip", [quantize.input[0], f"{name}_min", f"{name}_max"], [name],
            name=f"{name}_clip"))
    return name


def _float_weight(dequantize: onnx.NodeProto, weights, float_weights) -> onnx.TensorProto:
    """The float weight behind a weight's DequantizeLinear."""
    quantized = dequantize.input[0]
    base = quantized
    for suffix in _WEIGHT_SUFFIXES:
        base = base.removesuffix(suffix)
    if base in float_weights:
        values = numpy_helper.to_array(float_weights[base])
    else:
        values = _dequantized(dequantize, weights)
    return numpy_helper.from_array(values.astype(np.float32), f"{base}__float")


def _dequantized(dequantize: onnx.NodeProto, weights) -> np.ndarray:
    """The DequantizeLinear's values, computed (per-tensor or per-axis)."""
    values = numpy_helper.to_array(weights[dequantize.input[0]]).astype(np.float32)
    scale = numpy_helper.to_array(weights[dequantize.input[1]]).astype(np.float32)
    zero = (numpy_helper.to_array(weights[dequantize.input[2]]).astype(np.float32)
            if len(dequantize.input) > 2 and dequantize.input[2] else np.zeros_like(scale))
    axis = next((a.i for a in dequantize.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * values.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (values - zero) * scale


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove Q/DQ nodes (and initializers) whose outputs nothing reads."""
    outputs = {value.name for value in graph.output}
    while True:
        read = {name for node in graph.node for name in node.input} | outputs
        unread = [node for node in graph.node
                  if node.op_type in ("QuantizeLinear", "DequantizeLinear")
                  and not any(out in read for out in node.output)]
        if not unread:
            break
        for node in unread:
            graph.node.remove(node)
    read = {name for node in graph.node for name in node.input} | outputs
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
