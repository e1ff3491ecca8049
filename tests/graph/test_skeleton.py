"""Unit tests for bisect_onnx.graph.skeleton: a file's graph read without its weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.graph.skeleton import load_skeleton


def _model() -> onnx.ModelProto:
    """A float16 weight held raw, an int64 one held as int64_data, a Constant, a Cast."""
    big = numpy_helper.from_array(np.arange(3000, dtype=np.float16).reshape(30, 100), "w")
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [100, 30])
    nodes = [helper.make_node("Reshape", ["w", "shape"], ["r"]),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.array([2.0], dtype=np.float16), "c_value")),
             helper.make_node("Mul", ["r", "c"], ["m"]),
             helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [100, 30])], initializer=[big, shape])
    return helper.make_model(graph, producer_name="test")


def test_the_skeleton_is_the_model_with_its_initializers_data_left_out(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    expected = onnx.load(str(path))
    for tensor in expected.graph.initializer:
        tensor.ClearField("raw_data")
        tensor.ClearField("int64_data")
    skeleton = load_skeleton(path)
    assert skeleton == expected
    assert [(t.name, t.data_type, list(t.dims)) for t in skeleton.graph.initializer] == [
        ("w", TensorProto.FLOAT16, [30, 100]), ("shape", TensorProto.INT64, [2])]
    assert skeleton.graph.node[1].attribute[0].t.raw_data  # a node's own tensor stays


def test_a_file_that_is_no_model_is_left_to_onnx_load_and_its_error(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x3a\xff")  # the graph field, its length running past the end
    with pytest.raises(Exception) as onnx_error:
        onnx.load(str(path), load_external_data=False)
    with pytest.raises(type(onnx_error.value)):
        load_skeleton(path)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert load_skeleton(empty) == onnx.ModelProto()  # as onnx.load reads an empty file
