"""The size of a full capture, estimated from shapes before either side holds a value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.runtime.memory import estimate_values_bytes

WEIGHT = np.zeros((1000, 1000), dtype=np.float32)  # 4 MB


def _model() -> onnx.ModelProto:
    """Three small values of known shape, a weight transposed (4 MB), and five values
    whose shape depends on an input's contents (unknown to shape inference)."""
    nodes = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Relu", ["r1"], ["r2"]),
             helper.make_node("Relu", ["r2"], ["r3"]),
             helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Reshape", ["r3", "target"], ["u0"])]
    nodes += [helper.make_node("Relu", [f"u{i}"], [f"u{i + 1}"]) for i in range(4)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("u4", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("wt", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(WEIGHT, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unknown_shapes_are_not_sized_like_a_transposed_weight():
    model = _model()
    inputs = [np.zeros((1, 16), np.float32), np.array([4, 4], np.int64)]
    estimate = estimate_values_bytes(model, inputs)
    small = 16 * 4
    # The weight's transpose once, and every other value the size of the typical one:
    # a mean would have sized each unknown value at a quarter of the weight.
    assert estimate == WEIGHT.nbytes + 3 * small + 5 * small


def test_no_known_shape_gives_no_estimate():
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert estimate_values_bytes(model, [np.zeros((1, 16), np.float32),
                                         np.array([4, 4], np.int64)]) is None
