"""An op's value stands for it where the node after it is one a tool inserted.

A ``Mul`` inserted after a Linear's MatMul cuts its translation short: the MatMul's value
is not the op's. One inserted after an ``add`` leaves the Add's value the op's, and
PyTorch's value names the inserted node inside a fused layer (OpenVINO fused the Add and
the inserted Mul with the rest of the block: corpus seed 1023).
"""

from __future__ import annotations

import numpy as np

from bisect_onnx.align.script_inside import references_by_onnx_value
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture


def test_a_one_node_op_s_value_stands_for_it_whatever_was_inserted_after_it():
    # x -> MatMul (linear, cut short by an inserted Mul before its Add) ; y -> Add (add)
    # -> inserted Mul: the Add's value is the add's, the MatMul's is not the linear's.
    matmul = NodeInfo(0, "/fc/MatMul", "MatMul", ("mm",), None, ("x", "w"))
    add = NodeInfo(1, "/Add", "Add", ("sum",), None, ("y", "z"))
    inserted = [NodeInfo(2, "planted_Mul", "Mul", ("mm_planted",), None, ("mm", "k")),
                NodeInfo(3, "planted_Mul_1", "Mul", ("sum_planted",), None, ("sum", "k"))]
    ops = ScriptOpCapture(
        ops=[ScriptOp("linear", "aten::linear", "", None), ScriptOp("add", "aten::add", "", None)],
        values={"linear": np.zeros(2), "add": np.ones(2)})
    found = references_by_onnx_value({"linear": [matmul], "add": [add]}, ops,
                                     [matmul, add, *inserted])
    assert set(found) == {"sum"} and found["sum"] is ops.values["add"]
