"""Making the float16/bfloat16 candidate with some nodes kept in float32.

Float16: the float32 reference is converted again by onnxconverter-common with the
keep-list as ``node_block_list`` (the call a user reruns). bfloat16: onnxconverter-common
has no bfloat16 converter, so the kept nodes are put back to float32 in the candidate
itself: a Cast to float32 before each bfloat16 input, the float32 weight (the
reference's, by name, where it has one, also for a weight read through a Cast),
and a Cast back to bfloat16 after each output.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.chatter import chatter_logged
from bisect_onnx.errors import UsageError

__all__ = ["float16_converter", "keep_io_types_of", "float16_keeping", "bfloat16_keeping",
           "low_precision_type"]


def float16_converter():
    """onnxconverter-common's ``convert_float_to_float16``, imported only when needed."""
    try:
        from onnxconverter_common.float16 import convert_float_to_float16
    except ImportError:
        raise UsageError("the float16 fix search needs onnxconverter-common: "
                         "pip install bisect-onnx[float16]") from None
    return convert_float_to_float16


def low_precision_type(model: onnx.ModelProto) -> int | None:
    """FLOAT16 or BFLOAT16, whichever the candidate's weights or values use most."""
    counts = {TensorProto.FLOAT16: 0, TensorProto.BFLOAT16: 0}
    for tensor in model.graph.initializer:
        if tensor.data_type in counts:
            counts[tensor.data_type] += 1
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        kind = value.type.tensor_type.elem_type
        if kind in counts:
            counts[kind] += 1
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i in counts:
                counts[attribute.i] += 1
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def keep_io_types_of(candidate: onnx.ModelProto) -> bool:
    """Whether the candidate kept float32 inputs/outputs (``keep_io_types=True``)."""
    values = [*candidate.graph.input, *candidate.graph.output]
    kinds = [value.type.tensor_type.elem_type for value in values]
    return TensorProto.FLOAT in kinds


def float16_keeping(reference: onnx.ModelProto, keep: Collection[str], *,
                    keep_io_types: bool, op_block_list: list[str] | None = None) -> onnx.ModelProto:
    """The reference converted to float16 with ``keep`` (node names) left in float32."""
    convert = float16_converter()
    copy = onnx.ModelProto()
    copy.CopyFrom(reference)
    options = {"op_block_list": op_block_list} if op_block_list is not None else {}
    # It warns of each weight it clips ("will be truncated to 10000.0"): for the log.
    with chatter_logged("onnxconverter-common's float16 conversion"):
        return convert(copy, keep_io_types=keep_io_types, node_block_list=sorted(keep),
                       **options)


def bfloat16_keeping(candidate: onnx.ModelProto, keep: Collection[str],
                     reference: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """The bfloat16 candidate with the ``keep`` nodes computing in float32 between Casts."""
    model = onnx.shape_inference.infer_shapes(candidate)
    graph = model.graph
    bf16 = {v.name for v in [*graph.input, *graph.output, *graph.value_info]
            if v.type.tensor_type.elem_type == TensorProto.BFLOAT16}
    weights = {t.name: t for t in graph.initializer}
    float_weights = {t.name: t for t in (reference.graph.initializer if reference else [])}
    # A bfloat16 weight read through a Cast to float32: the kept node reads the float32 weight.
    cast_weights = {node.output[0]: weights[node.input[0]] for node in graph.node
                    if node.op_type == "Cast" and node.input[0] in weights
                    and weights[node.input[0]].data_type == TensorProto.BFLOAT16}
    nodes = []
    for node in graph.node:
        if node.name not in keep:
            nodes.append(node)
            continue
        for index, name in enumerate(node.input):
            if name in cast_weights:
                low = cast_weights[name]
                known = float_weights.get(name, float_weights.get(low.name))
                graph.initializer.append(_float_weight(low, known))
                node.input[index] = graph.initializer[-1].name
            elif name in weights and weights[name].data_type == TensorProto.BFLOAT16:
                graph.initializer.append(_float_weight(weights[name], float_weights.get(name)))
                node.input[index] = graph.initializer[-1].name
            elif name in bf16:
                cast = f"{name}__{node.name}__float32"
                nodes.append(helper.make_node("Cast", [name], [cast], to=TensorProto.FLOAT,
                                              name=f"{node.name}__cast_in{index}"))
                node.input[index] = cast
        after = []
        for index, name in enumerate(node.output):
            if name in bf16:
                node.output[index] = f"{name}__float32"
                after.append(helper.make_node("Cast", [node.output[index]], [name],
                                              to=TensorProto.BFLOAT16,
                                              name=f"{node.name}__cast_out{index}"))
        nodes.extend([node, *after])
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return model


def _float_weight(weight: onnx.TensorProto, reference: onnx.TensorProto | None) -> onnx.TensorProto:
    """The float32 form of a bfloat16 weight: the reference's where it has one."""
    if reference is not None and reference.data_type == TensorProto.FLOAT:
        values = numpy_helper.to_array(reference)
    else:
        values = numpy_helper.to_array(weight).astype("float32")
    return numpy_helper.from_array(values.astype("float32"), f"{weight.name}__float32")
