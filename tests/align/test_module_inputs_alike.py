"""Several inputs of one call with one shape: each is the read value that holds its numbers."""

from __future__ import annotations

import numpy as np

from bisect_onnx.align.module_inputs import entering_pairs
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.runtime.sides import CapturedValue

RNG = np.random.default_rng(0)


def _value(name: str, array: np.ndarray) -> CapturedValue:
    return CapturedValue(name, array, Provenance(position=0, module="m"))


def test_an_unused_input_is_not_given_the_value_its_sibling_reads():
    """``SelfOutput(hidden_states, input_tensor)`` whose nodes read only the first."""
    hidden, unused = RNG.standard_normal((2, 4)), RNG.standard_normal((2, 4))
    entering = {"m": [_value("m (input 0)", hidden), _value("m (input 1)", unused)]}
    group = [NodeInfo(1, "m/MatMul", "MatMul", ("out",), None, ("h", "w"))]
    candidate = {"h": _value("h", hidden.astype(np.float64) + 1e-7)}
    pairs = entering_pairs(entering, {"m": group}, candidate, {}, group)
    assert [(reference.name, onnx.name) for reference, onnx in pairs] == [("m (input 0)", "h")]


def test_two_operands_of_one_shape_each_take_their_own_value():
    """``matmul_qk(q, k)``: both read, told apart by their numbers, not by their order."""
    q, k = RNG.standard_normal((2, 4, 4)), RNG.standard_normal((2, 4, 4))
    entering = {"qk": [_value("qk (input 0)", q), _value("qk (input 1)", k)]}
    group = [NodeInfo(1, "qk/MatMul", "MatMul", ("scores",), None, ("k_value", "q_value"))]
    candidate = {"q_value": _value("q_value", q), "k_value": _value("k_value", k)}
    pairs = entering_pairs(entering, {"qk": group}, candidate, {}, group)
    assert sorted((reference.name, onnx.name) for reference, onnx in pairs) == [
        ("qk (input 0)", "q_value"), ("qk (input 1)", "k_value")]
