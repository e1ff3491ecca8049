"""The OpenVINO capture plan's rounds and the bf16-aware classification, without OpenVINO.

The plan is driven by a stand-in compiler whose fusion rule is known (a value made an
output breaks the layer that reads it in place), so each round can be checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.view import GraphView
from bisect_onnx.runtime.openvino.layers import ExecutedLayer
from bisect_onnx.runtime.openvino.plan import leaving_values, plan_capture
from bisect_onnx.search.classify import KernelRuntime, Kind, classify

# a -> conv1 -> relu1 -> conv2 -> add(+relu1) -> relu2 -> out; the Add adds in place into
# relu1's buffer, so making relu1 an output splits (conv2, add, relu2) in two.
NODES = [NodeInfo(0, "conv1", "Conv", ("c1",), None, ("a",)),
         NodeInfo(1, "relu1", "Relu", ("r1",), None, ("c1",)),
         NodeInfo(2, "conv2", "Conv", ("c2",), None, ("r1",)),
         NodeInfo(3, "add", "Add", ("s",), None, ("c2", "r1")),
         NodeInfo(4, "relu2", "Relu", ("r2",), None, ("s",)),
         NodeInfo(5, "conv3", "Conv", ("out",), None, ("r2",))]
INDEX = GraphView.of(NODES)


def _layer(name: str, *nodes: str, precision: str = "bf16",
           kind: str = "Convolution") -> ExecutedLayer:
    return ExecutedLayer(name, kind, precision, precision, tuple(nodes))


def _production(kind: str) -> list[ExecutedLayer]:
    return [_layer("L1", "conv1", "relu1", kind=kind),
            _layer("L2", "conv2", "add", "relu2", kind=kind),
            _layer("L3", "conv3", precision="f32", kind=kind)]


PRODUCTION = _production("Convolution")
#: The same layers under a type the plan knows no in-place rule for: found by rounds.
OPAQUE = _production("Subgraph")


def _compiler(calls: list, production: list[ExecutedLayer] = PRODUCTION):
    kind = production[0].layer_type

    def compile_capture(names, types):
        calls.append((list(names), dict(types)))
        if "r1" in names:  # the in-place sum cannot write into an output
            return "split", [production[0], _layer("L2a", "conv2", kind=kind),
                             _layer("L2b", "add", "relu2", kind=kind), production[2]]
        return "same", list(production)
    return compile_capture


def test_the_values_leaving_each_layer_are_the_candidates():
    leaving = leaving_values(PRODUCTION, INDEX, finals={"out"})
    assert {name: layer.name for name, layer in leaving.items()} == {"r1": "L1", "r2": "L2"}


def test_the_residual_a_convolution_adds_in_place_is_left_out_from_the_start():
    calls: list = []
    plan = plan_capture(PRODUCTION, INDEX, {"out"}, _compiler(calls))
    assert plan.layers_match_production and plan.compiled == "same"
    # Production's layers say L2's Convolution adds r1 into its result in place: r1 is
    # not asked for, r2 is (in bf16, its layer's output precision), and the first
    # compilation is production's.
    assert calls == [(["r2"], {"r2": "bf16"})] and plan.rounds == 1
    assert plan.dropped == {"r1": "L2"}
    assert plan.captured == ["r2"] and plan.element_types == {"r2": "bf16"}


def test_a_residual_the_plan_did_not_foresee_is_the_first_guess(monkeypatch):
    from bisect_onnx.runtime.openvino import plan as openvino_plan

    monkeypatch.setattr(openvino_plan, "_foreseen", lambda *_: {})
    calls: list = []
    plan = plan_capture(PRODUCTION, INDEX, {"out"}, _compiler(calls))
    # Both asked for; L2 is lost, and the first guess drops the residual its Convolution
    # adds into in place (r1), not what it hands out (r2).
    assert calls == [(["r1", "r2"], {"r1": "bf16", "r2": "bf16"}), (["r2"], {"r2": "bf16"})]
    assert plan.dropped == {"r1": "L2"} and plan.captured == ["r2"]


def test_a_value_that_breaks_a_fusion_is_dropped_and_the_rest_kept_in_their_precision():
    calls: list = []
    plan = plan_capture(OPAQUE, INDEX, {"out"}, _compiler(calls, OPAQUE))
    assert plan.layers_match_production and plan.compiled == "same"
    # No in-place rule for these layers: the first guess drops what the split L2 hands
    # out (r2); r1 still splits it, so round 2 drops by neighbourhood, and the restore
    # tries both back.
    assert calls[0] == (["r1", "r2"], {"r1": "bf16", "r2": "bf16"})
    assert calls[1] == (["r1"], {"r1": "bf16"})
    assert calls[2] == ([], {})
    assert plan.dropped == {"r1": "L2"}
    assert "r1" not in plan.captured


def test_a_dropped_value_that_did_not_break_anything_is_restored():
    calls: list = []
    plan = plan_capture(OPAQUE, INDEX, {"out"}, _compiler(calls, OPAQUE))
    assert plan.captured == ["r2"]
    assert plan.element_types == {"r2": "bf16"}
    assert [names for names, _ in calls[-1:]] == [["r2"]]


# x -> fc -> bias -> view -> tr -> mm -> out, and fc2 far away: OpenVINO folds the bias
# Add and a scale into fc (no layer names the Add) across view and tr, which asking
# for any of their values undoes. The mask, computed as u8, is handed out as a boolean
# through a Convert of its own, which changes nothing production computes.
FOLDING = [NodeInfo(0, "fc", "MatMul", ("f",), None, ("x",)),
           NodeInfo(1, "bias", "Add", ("b",), None, ("f", "w")),
           NodeInfo(2, "view", "Reshape", ("v",), None, ("b",)),
           NodeInfo(3, "tr", "Transpose", ("t",), None, ("v",)),
           NodeInfo(4, "mm", "MatMul", ("m",), None, ("t", "x")),
           NodeInfo(5, "isnan", "IsNaN", ("n",), None, ("m",)),
           NodeInfo(6, "fc2", "Where", ("g",), None, ("n", "m")),
           NodeInfo(7, "relu", "Relu", ("out",), None, ("g",))]
FOLDING_INDEX = GraphView.of(FOLDING)
FC = ExecutedLayer("fc", "FullyConnected", "f32", "f32", ("fc",), ("Multiply_#",))
FOLDED = [FC, *(ExecutedLayer(node.name, "Op", "f32", "u8" if node.name == "isnan" else "f32",
                              (node.name,)) for node in FOLDING[2:])]


def test_a_scale_folded_across_layout_ops_is_left_out_from_the_start():
    calls: list = []

    def compile_capture(names, types):
        calls.append(list(names))
        convert = [ExecutedLayer("isnan.0", "Convert", "u8", "boolean", (), ("isnan.#",))
                   ] if "n" in names else []
        if {"f", "v", "t"} & set(names):  # the scale stays out of the FullyConnected
            return "unfolded", [FC.__class__(**{**FC.__dict__, "own_operations": ()}),
                                *FOLDED[1:], *convert]
        return "folded", [*FOLDED, *convert]

    plan = plan_capture(FOLDED, FOLDING_INDEX, {"out"}, compile_capture)
    # The FullyConnected folded an op: its output and the layout ops after it are not
    # asked for, the rest is, and nothing more is compiled.
    assert calls == [["m", "n", "g"]]
    assert plan.compiled == "folded" and plan.captured == ["m", "n", "g"]
    assert set(plan.dropped) == {"f", "v", "t"}


@pytest.mark.parametrize("kind", ["Convolution", "Subgraph"])
def test_groups_of_distant_layers_are_tried_back_in_one_compilation(kind):
    # Two far-apart copies of the in-place sum, each broken by its residual input.
    nodes = [*NODES[:5], NodeInfo(5, "conv3", "Conv", ("c3",), None, ("r2",)),
             NodeInfo(6, "relu3", "Relu", ("r3",), None, ("c3",)),
             NodeInfo(7, "conv4", "Conv", ("c4",), None, ("r3",)),
             NodeInfo(8, "conv5", "Conv", ("c5",), None, ("c4",)),
             NodeInfo(9, "add2", "Add", ("s2",), None, ("c5", "c4")),
             NodeInfo(10, "relu4", "Relu", ("out",), None, ("s2",))]
    index = GraphView.of(nodes)
    production = [_layer(name, *held, kind=kind) for name, *held in (
        ("L1", "conv1", "relu1"), ("L2", "conv2", "add", "relu2"), ("L3", "conv3", "relu3"),
        ("L4", "conv4"), ("L5", "conv5", "add2", "relu4"))]
    calls: list = []

    def compile_capture(names, types):
        calls.append(list(names))
        layers = list(production)
        if "r1" in names:
            layers[1:2] = [_layer("L2a", "conv2", kind=kind),
                           _layer("L2b", "add", "relu2", kind=kind)]
        if "c4" in names:
            layers[-1:] = [_layer("L5a", "conv5", kind=kind),
                           _layer("L5b", "add2", "relu4", kind=kind)]
        return len(calls), layers

    plan = plan_capture(production, index, {"out"}, compile_capture)
    assert plan.layers_match_production
    assert set(plan.dropped) == {"r1", "c4"}
    assert set(plan.captured) == {"r2", "r3"}
    if kind == "Convolution":  # both residuals added in place: left out from the start
        assert len(calls) == 1
        return
    # Each restoring compilation tries a group from both changed layers at once.
    restoring = calls[3:]
    assert any({"r1", "c4"} <= set(names) for names in restoring)
    assert len(restoring) <= 4


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


def test_independent_layers_in_another_order_are_production_s_layers():
    calls: list = []

    def compile_capture(names, types):
        calls.append(list(names))
        return "swapped", [OPAQUE[1], OPAQUE[0], OPAQUE[2]]

    plan = plan_capture(OPAQUE, INDEX, {"out"}, compile_capture)
    # Two branches run either way round: each layer computes the same, nothing dropped.
    assert calls == [["r1", "r2"]] and plan.captured == ["r1", "r2"]
    assert plan.layers_match_production and not plan.dropped


def test_a_changed_layer_of_openvino_s_own_operations_is_found_by_the_node_it_was():
    # a -> n1 -> m -> n2 -> n3: production runs m as a Multiply of its own, under a name
    # no ONNX node has; asking for m's input makes it come back as node m.
    nodes = [NodeInfo(0, "n1", "MatMul", ("x1",), None, ("a",)),
             NodeInfo(1, "m", "Mul", ("xm",), None, ("x1",)),
             NodeInfo(2, "n2", "MatMul", ("y",), None, ("xm",)),
             NodeInfo(3, "n3", "Relu", ("out",), None, ("y",))]
    own = ExecutedLayer("Multiply_12", "Subgraph", "f32", "f32", (), ("Multiply_#",))
    production = [_layer("LA", "n1", precision="f32"), own, _layer("LB", "n2", precision="f32"),
                  _layer("LC", "n3", precision="f32")]

    def compile_capture(names, types):
        if "x1" in names:
            return "split", [production[0], _layer("m", "m", precision="f32"),
                             *production[2:]]
        return "same", list(production)

    plan = plan_capture(production, GraphView.of(nodes), {"out"}, compile_capture)
    assert plan.layers_match_production and plan.compiled == "same"
    assert set(plan.dropped) == {"x1"} and plan.captured == ["y"]


# q -> tq (Transpose) -> mm -> sm -> mm2 -> to (Transpose) -> out2: an attention Subgraph
# whose Transposes split off when asked for; its MatMul's value is read outside too.
ATTENTION = [NodeInfo(0, "tq", "Transpose", ("t1",), None, ("q",)),
             NodeInfo(1, "mm", "MatMul", ("s",), None, ("t1", "k")),
             NodeInfo(2, "sm", "Softmax", ("p",), None, ("s",)),
             NodeInfo(3, "mm2", "MatMul", ("a",), None, ("p", "v")),
             NodeInfo(4, "to", "Transpose", ("t2",), None, ("a",)),
             NodeInfo(5, "use", "Relu", ("r",), None, ("t1",)),
             NodeInfo(6, "out", "Add", ("o",), None, ("t2", "s"))]


def test_an_attention_subgraph_s_transposes_are_left_out_from_the_start():
    index = GraphView.of(ATTENTION)
    production = [_layer("A", "tq", "mm", "sm", "mm2", "to", kind="Subgraph"),
                  _layer("U", "use", kind="Eltwise"), _layer("O", "out", kind="Eltwise")]
    calls: list = []

    def compile_capture(names, types):
        calls.append(list(names))
        if {"t1", "t2"} & set(names):
            return "split", [_layer("A1", "tq", kind="Transpose"),
                             _layer("A", "mm", "sm", "mm2", "to", kind="Subgraph"),
                             *production[1:]]
        return "same", list(production)

    plan = plan_capture(production, index, {"o"}, compile_capture)
    assert calls == [["s"]] and plan.compiled == "same"
    assert plan.dropped == {"t1": "A", "t2": "A"}


def test_an_integer_value_handed_out_through_a_renamed_copy_keeps_its_layer():
    # OpenVINO runs an int64 Unsqueeze in i32: asked for, its layer is renamed after a
    # copy of the node ("node_Unsqueeze_437.0", naming no ONNX node) and a Convert
    # (".0.0") hands the value out as int64. Production computes the same: the value is
    # kept. Another node of the same name but its number is asked for too.
    nodes = [NodeInfo(0, "node_Unsqueeze_437", "Unsqueeze", ("u",), None, ("mask",)),
             NodeInfo(1, "node_Unsqueeze_12", "Unsqueeze", ("v",), None, ("u",)),
             NodeInfo(2, "cast", "Cast", ("c",), None, ("v",)),
             NodeInfo(3, "relu", "Relu", ("out",), None, ("c",))]
    production = [_layer(node.name, node.name, precision="i32", kind="Reshape")
                  for node in nodes[:2]] + [
        _layer("cast", "cast", precision="f32", kind="Convert"),
        _layer("relu", "relu", precision="f32", kind="Eltwise")]
    calls: list = []

    def compile_capture(names, types):
        calls.append(list(names))
        if "u" not in names:
            return "plain", list(production)
        return "with u", [
            ExecutedLayer("node_Unsqueeze_437.0", "Reshape", "i32", "i32", (),
                          ("node_Unsqueeze_#.#",)),
            ExecutedLayer("node_Unsqueeze_437.0.0", "Convert", "i32", "i64", (),
                          ("node_Unsqueeze_#.#.#",)),
            *production[1:]]

    plan = plan_capture(production, GraphView.of(nodes), {"out"}, compile_capture)
    assert calls == [["u", "v", "c"]] and plan.captured == ["u", "v", "c"]
    assert plan.layers_match_production and plan.compiled == "with u"
