"""Unit tests for bisect_onnx.graph.walk: every tensor a graph holds, nested graphs included."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.graph.walk import graph_tensors, subgraphs


def _tensor(name: str, value: float) -> TensorProto:
    return numpy_helper.from_array(np.array([value], dtype=np.float32), name)


def _branch(name: str, weight: str) -> object:
    """A one-node If branch that adds a weight of its own to the outer ``x``."""
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1])
    node = helper.make_node("Add", ["x", weight], [f"{name}_out"])
    return helper.make_graph([node], name, [], [out], initializer=[_tensor(weight, 2.0)])


def _model_graph() -> object:
    sparse = helper.make_sparse_tensor(
        _tensor("sparse_values", 3.0),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "sparse_indices"), [4])
    constant = helper.make_node("Constant", [], ["c"], value=_tensor("constant_value", 4.0))
    branches = helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "then_w"),
                                else_branch=_branch("else", "else_w"))
    return helper.make_graph(
        [constant, branches], "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[_tensor("w", 1.0)], sparse_initializer=[sparse])


def test_graph_tensors_finds_weights_sparse_parts_attributes_and_branch_weights():
    names = [tensor.name for tensor in graph_tensors(_model_graph())]
    assert names[:4] == ["w", "sparse_values", "sparse_indices", "constant_value"]
    assert sorted(names[4:]) == ["else_w", "then_w"]  # attribute order is the writer's


def test_subgraphs_yields_an_ifs_branches_and_nothing_for_a_plain_attribute():
    graph = _model_graph()
    constant, branches = graph.node
    assert [list(subgraphs(attribute)) for attribute in constant.attribute] == [[]]
    assert sorted(g.name for attribute in branches.attribute for g in subgraphs(attribute)) == [
        "else", "then"]


def test_graph_tensors_reads_graphs_attributes_too():
    body = _branch("body", "body_w")
    node = helper.make_node("Custom", [], ["z"], domain="test", bodies=[body])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info(
        "z", TensorProto.FLOAT, [1])])
    assert [tensor.name for tensor in graph_tensors(graph)] == ["body_w"]
