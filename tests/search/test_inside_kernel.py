"""The value inside a fused kernel that names its node: the first that fails, on the data path."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from onnx import TensorProto, helper

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.graph.segments import Segment
from bisect_onnx.judge.record_parts import LocalOutcome
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.inside_kernel import first_failing_inside
from bisect_onnx.search.local import LocalCheck

# x -> sub -> mul (inserted) -> slice -> relu -> y; the Slice's end is the Mul's width
# halved, computed from its Shape (with a weight for the index), as TorchScript exports.
NODES = [NodeInfo(0, "sub", "Sub", ("s",), None, ("x", "c")),
         NodeInfo(1, "mul", "Mul", ("m",), None, ("s", "k")),
         NodeInfo(2, "shape", "Shape", ("shape",), None, ("m",)),
         NodeInfo(3, "gather", "Gather", ("width",), None, ("shape", "one")),
         NodeInfo(4, "slice", "Slice", ("sl",), None, ("m", "starts", "width")),
         NodeInfo(5, "relu", "Relu", ("y",), None, ("sl",))]
WEIGHTS = ("c", "k", "one", "starts")


def _candidate():
    graph = helper.make_graph([], "g", [], [], initializer=[
        helper.make_tensor(name, TensorProto.INT64, [], [0]) for name in WEIGHTS])
    return SimpleNamespace(nodes=NODES, model=helper.make_model(graph))


def _value(name: str, array: np.ndarray) -> CapturedValue:
    return CapturedValue(name, array, Provenance(position=0))


def test_a_shape_that_passes_does_not_hide_the_data_path_before_it():
    s, width = np.arange(8, dtype=np.float32), np.array(8)
    local = {"s": s, "m": s * 1.5, "shape": np.array([8]), "width": width, "sl": s * 1.5,
             "y": s * 1.5}
    check = LocalCheck("y", segment=Segment(nodes=list(range(6)), initializers=set(WEIGHTS),
                                            inputs={"x": "reference"}), values=local)
    # The reference has the Sub's value, the width (an integer) and the Slice's value,
    # not the inserted Mul's: the width agrees, as a shape does whatever the data.
    references = {"s": _value("s", s), "width": _value("width", width),
                  "sl": _value("sl", s)}
    found = first_failing_inside(SimpleNamespace(index=0, local=LocalOutcome()), check,
                                 _candidate(), references, Tolerance(1e-3, 1e-5))
    assert found is not None
    record, nodes = found
    assert record.onnx_value == "sl"
    # What computed it since the last value on the data path that passes ("s"): the
    # Mul too, so the Slice alone is not named; the width's nodes passed.
    assert [NODES[index].name for index in nodes] == ["mul", "slice"]


def test_a_weight_s_transpose_that_passes_is_not_among_the_nodes_of_the_failing_value():
    nodes = [NodeInfo(0, "transpose", "Transpose", ("wt",), None, ("w",)),
             NodeInfo(1, "matmul", "MatMul", ("mm",), None, ("x", "wt")),
             NodeInfo(2, "relu", "Relu", ("y",), None, ("mm",))]
    graph = helper.make_graph([], "g", [], [], initializer=[
        helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])])
    candidate = SimpleNamespace(nodes=nodes, model=helper.make_model(graph))
    weight, product = np.eye(2, dtype=np.float32), np.ones((2, 2), np.float32)
    check = LocalCheck("y", segment=Segment(nodes=[0, 1, 2], initializers={"w"},
                                            inputs={"x": "reference"}),
                       values={"wt": weight, "mm": product * 2, "y": product * 2})
    found = first_failing_inside(SimpleNamespace(index=0, local=LocalOutcome()), check,
                                 candidate, {"wt": _value("wt", weight),
                                             "mm": _value("mm", product)},
                                 Tolerance(1e-3, 1e-5))
    assert found is not None and found[0].onnx_value == "mm"
    assert [nodes[index].name for index in found[1]] == ["matmul"]  # named alone


def test_a_mask_that_passes_does_not_vouch_for_the_value_it_was_taken_of():
    # softmax -> mul (inserted) -> isnan -> where(isnan, zero, mul): Llama's attention.
    nodes = [NodeInfo(0, "mul", "Mul", ("m",), None, ("p", "k")),
             NodeInfo(1, "isnan", "IsNaN", ("nan",), None, ("m",)),
             NodeInfo(2, "where", "Where", ("w",), None, ("nan", "zero", "m")),
             NodeInfo(3, "relu", "Relu", ("y",), None, ("w",))]
    graph = helper.make_graph([], "g", [], [], initializer=[
        helper.make_tensor(name, TensorProto.FLOAT, [], [0.0]) for name in ("k", "zero")])
    candidate = SimpleNamespace(nodes=nodes, model=helper.make_model(graph))
    p, no_nan = np.full(4, 0.25, np.float32), np.zeros(4, bool)
    check = LocalCheck("y", segment=Segment(nodes=[0, 1, 2, 3], initializers={"k", "zero"},
                                            inputs={"p": "reference"}),
                       values={"m": p * 1.5, "nan": no_nan, "w": p * 1.5, "y": p * 1.5})
    found = first_failing_inside(SimpleNamespace(index=0, local=LocalOutcome()), check,
                                 candidate, {"nan": _value("nan", no_nan), "w": _value("w", p)},
                                 Tolerance(1e-3, 1e-5))
    assert found is not None and found[0].onnx_value == "w"
    # The mask agrees (no NaN either way), but the Where reads the Mul's value as well.
    assert [nodes[index].name for index in found[1]] == ["mul", "where"]


def test_integers_of_another_width_are_not_compared():
    check = LocalCheck("y", segment=Segment(nodes=list(range(6)), initializers=set(WEIGHTS),
                                            inputs={"x": "reference"}),
                       values={"width": np.array(4, np.int32), "sl": np.zeros(8, np.float32)})
    references = {"width": _value("width", np.array(8, np.int64)),
                  "sl": _value("sl", np.zeros(8, np.float32))}
    # An i64 the runtime computed as i32 says nothing either way: not the culprit.
    assert first_failing_inside(SimpleNamespace(index=0, local=LocalOutcome()), check,
                                _candidate(), references, Tolerance(1e-3, 1e-5)) is None


def test_a_failing_value_masked_on_every_path_to_the_output_is_passed_over():
    # log -> greater(log, 0) -> and(isinf) -> where(., c, log) + mul(planted) -> y: the
    # runtime's Greater disagrees on NaN, but the And with IsInf masks it (corpus seed
    # 2019, OpenVINO); the planted Mul is where the output's error comes from.
    nodes = [NodeInfo(0, "greater", "Greater", ("gt",), None, ("log", "zero")),
             NodeInfo(1, "isinf", "IsInf", ("inf",), None, ("log",)),
             NodeInfo(2, "and", "And", ("posinf",), None, ("gt", "inf")),
             NodeInfo(3, "where", "Where", ("w",), None, ("posinf", "c", "log")),
             NodeInfo(4, "mul", "Mul", ("m",), None, ("q", "k")),
             NodeInfo(5, "add", "Add", ("y",), None, ("w", "m"))]
    graph = helper.make_graph([], "g", [], [], initializer=[
        helper.make_tensor(name, TensorProto.FLOAT, [], [0.0]) for name in ("zero", "c", "k")])
    candidate = SimpleNamespace(nodes=nodes, model=helper.make_model(graph))
    log = np.array([np.nan, 1.0, -1.0, 2.0], np.float32)
    greater = np.array([False, True, False, True])
    masked = np.zeros(4, bool)
    local = {"gt": np.array([True, True, False, True]), "inf": masked, "posinf": masked,
             "w": log, "m": np.full(4, 2.1, np.float32), "y": log + 2.1}
    references = {name: _value(name, array) for name, array in (
        ("gt", greater), ("inf", masked), ("posinf", masked), ("w", log),
        ("m", np.full(4, 2.0, np.float32)))}
    check = LocalCheck("y", segment=Segment(nodes=list(range(6)), initializers={"zero", "c", "k"},
                                            inputs={"log": "reference", "q": "reference"}),
                       values=local)
    found = first_failing_inside(SimpleNamespace(index=0, local=LocalOutcome()), check,
                                 candidate, references, Tolerance(1e-3, 1e-5))
    assert found is not None and found[0].onnx_value == "m"
    assert [nodes[index].name for index in found[1]] == ["mul"]
