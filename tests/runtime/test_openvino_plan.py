"""The OpenVINO capture plan's rounds and the bf16-aware classification, without OpenVINO.

The plan is driven by a stand-in compiler whose fusion rule is known (a value made an
output breaks the layer that reads it in place), so each round can be checked exactly.
"""

from __future__ import annotations

import numpy as np

from bisect_onnx.runtime.onnx_side import NodeInfo
from bisect_onnx.runtime.openvino_layers import ExecutedLayer, GraphIndex
from bisect_onnx.runtime.openvino_plan import leaving_values, plan_capture
from bisect_onnx.search.classify import KernelRuntime, Kind, classify

# a -> conv1 -> relu1 -> conv2 -> add(+relu1) -> relu2 -> out; the Add adds in place into
# relu1's buffer, so making relu1 an output splits (conv2, add, relu2) in two.
NODES = [NodeInfo(0, "conv1", "Conv", ("c1",), None, ("a",)),
         NodeInfo(1, "relu1", "Relu", ("r1",), None, ("c1",)),
         NodeInfo(2, "conv2", "Conv", ("c2",), None, ("r1",)),
         NodeInfo(3, "add", "Add", ("s",), None, ("c2", "r1")),
         NodeInfo(4, "relu2", "Relu", ("r2",), None, ("s",)),
         NodeInfo(5, "conv3", "Conv", ("out",), None, ("r2",))]
INDEX = GraphIndex.of(NODES)


def _layer(name: str, *nodes: str, precision: str = "bf16") -> ExecutedLayer:
    return ExecutedLayer(name, "Convolution", precision, precision, tuple(nodes))


PRODUCTION = [_layer("L1", "conv1", "relu1"), _layer("L2", "conv2", "add", "relu2"),
              _layer("L3", "conv3", precision="f32")]


def _compiler(calls: list):
    def compile_capture(names, types):
        calls.append((list(names), dict(types)))
        if "r1" in names:  # the in-place sum cannot write into an output
            return "split", [PRODUCTION[0], _layer("L2a", "conv2"),
                             _layer("L2b", "add", "relu2"), PRODUCTION[2]]
        return "same", list(PRODUCTION)
    return compile_capture


def test_the_values_leaving_each_layer_are_the_candidates():
    leaving = leaving_values(PRODUCTION, INDEX, finals={"out"})
    assert {name: layer.name for name, layer in leaving.items()} == {"r1": "L1", "r2": "L2"}


def test_a_value_that_breaks_a_fusion_is_dropped_and_the_rest_kept_in_their_precision():
    calls: list = []
    plan = plan_capture(PRODUCTION, INDEX, {"out"}, _compiler(calls))
    assert plan.layers_match_production and plan.compiled == "same"
    # Round 1 asks for both, in bf16 (their layers' output precision); the split L2
    # drops what touches it; the restore tries r1 back, which splits L2 again.
    assert calls[0] == (["r1", "r2"], {"r1": "bf16", "r2": "bf16"})
    assert plan.dropped == {"r1": "L2"}
    assert "r1" not in plan.captured
    assert calls[1] == ([], {})  # round 2: without r1 and r2, production's layers
    assert any("r1" in names for names, _ in calls[2:])  # the restore tried it back


def test_a_dropped_value_that_did_not_break_anything_is_restored():
    calls: list = []
    plan = plan_capture(PRODUCTION, INDEX, {"out"}, _compiler(calls))
    # Dropping by neighbourhood drops r2 with r1 (both touch L2); r2 alone keeps the
    # layers, so the restore brings it back.
    assert plan.captured == ["r2"]
    assert plan.element_types == {"r2": "bf16"}


def test_bf16_rounding_is_float_precision_where_the_runtime_computes_in_bf16():
    rng = np.random.default_rng(0)
    truth = rng.standard_normal(256)
    # What a bf16 kernel gives: the float64 truth rounded to bf16 (8 significant bits).
    bits = truth.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    bf16 = bits.view(np.float32)
    arguments = {"torch64": truth, "onnx64": truth.copy(), "torch32": truth.astype(np.float32),
                 "ort32": bf16, "rtol": 1e-3, "atol": 1e-5}
    as_float32 = classify(**arguments)
    as_bf16 = classify(**arguments, runtime=KernelRuntime("OpenVINO", "openvinotoolkit/openvino",
                                                          "bf16"))
    assert as_float32.kind == Kind.RUNTIME_KERNEL  # far beyond one float32 rounding
    assert "microsoft/onnxruntime" in as_float32.file_with
    assert as_bf16.kind == Kind.FLOAT_PRECISION and "bf16 rounding" in as_bf16.detail
