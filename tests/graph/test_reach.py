"""The values a graph's outputs are computed from."""

from __future__ import annotations

from bisect_onnx.graph.reach import feeding
from bisect_onnx.runtime.onnx_side import NodeInfo


def _node(index: int, op_type: str, inputs: tuple[str, ...], outputs: tuple[str, ...]):
    return NodeInfo(index, f"n{index}", op_type, outputs, None, inputs)


def test_an_output_of_a_node_nothing_reads_feeds_no_output():
    nodes = [_node(0, "TopK", ("x", "k"), ("values", "indices")),
             _node(1, "Mul", ("values", "factor"), ("scaled",)),
             _node(2, "Relu", ("x",), ("unused",))]
    found = feeding(nodes, ["scaled"])
    assert {"scaled", "values", "factor", "x", "k"} <= found
    # The TopK made both, but only its values are read on the way to the output.
    assert "indices" not in found and "unused" not in found


def test_control_flow_leaves_what_feeds_the_outputs_unknown():
    nodes = [_node(0, "If", ("condition",), ("branch",)),
             _node(1, "Relu", ("branch",), ("y",))]
    assert feeding(nodes, ["y"]) is None
