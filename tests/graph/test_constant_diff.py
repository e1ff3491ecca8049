"""Two exports of one model compared constant by constant (``graph/constant_diff.py``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.graph.constant_diff import graph_difference


def _model(divisor: float, shape: list[int], repeats: int = 1) -> onnx.ModelProto:
    """``x / divisor`` reshaped to ``shape``, then ``repeats`` Neg nodes."""
    nodes = [
        helper.make_node("Constant", [], ["/Constant_output_0"], name="/Constant",
                         value=numpy_helper.from_array(np.array(divisor, np.float32))),
        helper.make_node("Div", ["x", "/Constant_output_0"], ["div"], name="/Div"),
        helper.make_node("Reshape", ["div", "shape"], ["flat"], name="/Reshape"),
        helper.make_node("ReduceSum", ["flat"], ["out0"], name="/ReduceSum", keepdims=1),
    ]
    for index in range(repeats):
        nodes.append(helper.make_node("Neg", [f"out{index}"], [f"out{index + 1}"],
                                      name=f"/Neg_{index}"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(f"out{repeats}", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array(shape, np.int64), "shape")])
    return helper.make_model(graph)


def test_identical_exports_differ_in_nothing():
    assert graph_difference(_model(2.0, [2, -1]), _model(2.0, [2, -1])).empty


def test_a_constant_read_by_a_node_names_that_node_with_both_values():
    difference = graph_difference(_model(2.0, [2, -1]), _model(4.0, [4, -1]))
    found = {(each.node, each.part): (each.first, each.second) for each in difference.constants}
    assert found == {("/Div", "input 1"): ("2.0", "4.0"),
                     ("/Reshape", "input 1"): ("[2, -1]", "[4, -1]")}
    div = next(each for each in difference.constants if each.node == "/Div")
    assert div.sizes == (2,) and "ReduceSum" in div.feeds
    assert div.size_pairs() == {4: 2}  # a size of 4 at the second's shapes was 2
    assert not difference.counts


def test_an_attribute_that_differs_is_named():
    first, second = _model(2.0, [2, -1]), _model(2.0, [2, -1])
    second.graph.node[3].attribute[0].i = 0  # keepdims
    [difference] = graph_difference(first, second).constants
    assert (difference.node, difference.part, difference.first, difference.second) == (
        "/ReduceSum", "attribute 'keepdims'", "1", "0")


def test_a_node_repeated_more_often_is_counted():
    difference = graph_difference(_model(2.0, [2, -1], repeats=3), _model(2.0, [2, -1], 5))
    assert [(each.op_type, each.first, each.second) for each in difference.counts] == [
        ("Neg", 3, 5)]
