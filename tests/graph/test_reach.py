"""The values a graph's outputs are computed from."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.reach import feeding
from bisect_onnx.graph.view import GraphView


def _node(index: int, op_type: str, inputs: tuple[str, ...], outputs: tuple[str, ...]):
    return NodeInfo(index, f"n{index}", op_type, outputs, None, inputs)


def test_an_output_of_a_node_nothing_reads_feeds_no_output():
    nodes = [_node(0, "TopK", ("x", "k"), ("values", "indices")),
             _node(1, "Mul", ("values", "factor"), ("scaled",)),
             _node(2, "Relu", ("x",), ("unused",))]
    found = feeding(GraphView.of(nodes), ["scaled"])
    assert {"scaled", "values", "factor", "x", "k"} <= found
    # The TopK made both, but only its values are read on the way to the output.
    assert "indices" not in found and "unused" not in found


def test_a_node_holding_a_subgraph_leaves_what_feeds_the_outputs_unknown():
    """An If's branch may read any outer value (here ``outer``), not only its inputs."""
    branch = helper.make_graph([helper.make_node("Identity", ["outer"], ["picked"])], "branch",
                               [], [helper.make_tensor_value_info("picked", TensorProto.FLOAT,
                                                                  [1])])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["outer"]),
         helper.make_node("If", ["condition"], ["y"], then_branch=branch, else_branch=branch)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("condition", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    onnx.checker.check_model(model)
    nodes = [_node(0, "Relu", ("x",), ("outer",)), _node(1, "If", ("condition",), ("y",))]
    assert "outer" not in feeding(GraphView.of(nodes), ["y"])  # by inputs alone it looks unread
    assert feeding(GraphView.of(nodes), ["y"], model) is None


def test_the_walk_stops_at_a_value_both_sides_computed_alike():
    """A Where that discards an int64 value OpenVINO got wrong: the error stops there."""
    nodes = [_node(0, "BitwiseOr", ("shifted", "bits"), ("ored",)),
             _node(1, "Where", ("negative", "ored", "shifted"), ("picked",)),
             _node(2, "Mul", ("other", "scale"), ("scaled",)),
             _node(3, "Add", ("picked", "scaled"), ("out",))]
    assert "ored" in feeding(GraphView.of(nodes), ["out"])
    found = feeding(GraphView.of(nodes), ["out"], settled={"picked"})
    assert {"out", "picked", "scaled", "other", "scale"} <= found
    assert not {"ored", "shifted", "negative", "bits"} & found
