"""The shapes of values a capture left out, as far as shape inference knows them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.graph.value_shapes import value_shapes
from bisect_onnx.runtime.sides import CapturedValue


def _reshaped_by_its_own_shape() -> onnx.ModelProto:
    """x [4, 32] -> Reshape to [Shape(x)[0], 2, 16] -> Transpose: what TorchScript exports."""
    int64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "first"], ["batch"], axis=0),
             helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"]),
             helper.make_node("Concat", ["batch_1d", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["split"]),
             helper.make_node("Transpose", ["split"], ["y"], perm=[1, 0, 2])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None])],
        initializer=[helper.make_tensor("first", int64, [], [0]),
                     helper.make_tensor("axes", int64, [1], [0]),
                     helper.make_tensor("heads", int64, [2], [2, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def test_a_shape_computed_from_shape_nodes_is_known_without_a_captured_value():
    shapes = value_shapes(_reshaped_by_its_own_shape(), {})
    # Plain shape inference leaves the Reshape's output rank 3 of unknown sizes, which
    # an op of any shape would match; data propagation computes the target.
    assert shapes["split"] == ((4, 2, 16), np.dtype(np.float32))


def test_a_captured_value_says_its_own_shape():
    array = np.zeros((4, 2, 16), np.float32)
    shapes = value_shapes(_reshaped_by_its_own_shape(),
                          {"split": CapturedValue("split", array, Provenance(position=0))})
    assert shapes["split"] == ((4, 2, 16), np.dtype(np.float32))
    assert value_shapes(None, {}) == {}
