"""OpenVINO as the candidate's runtime: capture under its compiled graph, culprits found.

Real OpenVINO CPU compilations of the shared fixtures; each test takes a few seconds.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("openvino", reason="openvino is not importable here")

import bisect_onnx  # noqa: E402
from bisect_onnx import events  # noqa: E402
from bisect_onnx.cli.command import main  # noqa: E402
from bisect_onnx.report.verdict import verdict_line  # noqa: E402
from bisect_onnx.runtime.openvino.layers import executed_layers  # noqa: E402
from bisect_onnx.runtime.openvino.runner import OpenVinoRunner  # noqa: E402
from fixtures.registry import FIXTURES, REPO_ROOT, load_inputs, repo_path  # noqa: E402
from tests.planting import (  # noqa: E402
    insert_mul,
    plant,
    scale_conv_weight,
    scale_initializer_input,
    set_attribute,
)

OPENVINO = bisect_onnx.RuntimeOptions(runtime="openvino")
OPENVINO_F32 = bisect_onnx.RuntimeOptions(runtime="openvino", precision="f32")


def _inputs(name: str) -> list[np.ndarray]:
    return list(load_inputs(FIXTURES[name]).values())


def _side(name: str, precision: str | None = None) -> OpenVinoRunner:
    return OpenVinoRunner(repo_path(FIXTURES[name].onnx_file), precision=precision)


@pytest.mark.parametrize("precision", [None, "f32"], ids=["default precision", "f32"])
@pytest.mark.parametrize("name", ["resnet_like", "tiny_transformer"])
def test_the_capture_runs_productions_layers_and_its_outputs(name, precision):
    side = _side(name, precision)
    ran = side.run(_inputs(name))
    capture = ran.capture
    plan = side.plan
    assert plan.layers_match_production and plan.captured
    assert ran.production.matches is True
    for ours, theirs in zip(capture.outputs, side.run_outputs(_inputs(name)), strict=True):
        assert np.array_equal(ours.array, theirs.array)  # bitwise production's
    # Every captured value says which of production's layers produced it, and how.
    layers = {layer.name: layer for layer in side.production_layers}
    for value in capture.values.values():
        layer_name, layer_type, precision_ran = value.provenance.runtime_layer
        layer = layers[layer_name]
        assert value.provenance.node in layer.nodes
        assert (layer_type, precision_ran) == (layer.layer_type, layer.runtime_precision)
        assert value.array.dtype == np.float32  # bf16 values widened exactly


def test_asking_for_every_leaving_value_changes_the_fusions_the_plan_keeps():
    side = _side("resnet_like")
    side.prepare()
    plan = side.plan
    # What a naive capture asks for breaks production's Conv+Add+Relu layers ...
    compiled, naive = side._compile_capture(plan.candidates, {})
    assert [layer.signature() for layer in naive] != [
        layer.signature() for layer in plan.production_layers]
    # ... while the plan's capture compiles to production's layers, and says what it left.
    assert [layer.signature() for layer in executed_layers(plan.compiled, side.view)] == [
        layer.signature() for layer in plan.production_layers]
    assert plan.dropped and set(plan.dropped) | set(plan.captured) == set(plan.candidates)


@pytest.mark.parametrize("name", ["tiny_mlp", "resnet_like", "tiny_transformer", "two_inputs"])
def test_parity_on_the_fixtures_in_f32(name, fixture_case):
    model, inputs, onnx_path = fixture_case(name)
    seen = []
    with events.listening(seen.append):
        report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=OPENVINO_F32)
    assert report.verdict == "parity", verdict_line(report)
    assert "OpenVINO" in [event.detail for event in seen if event.kind == events.CAPTURE_STARTED]
    assert report.capture["layers_match_production"] is True
    assert report.capture["outputs_match_production"] is True
    assert report.environment["runtime"] == "openvino"
    assert report.to_dict()["candidate"]["inference_precision"] == "f32"


# At its default precision (bf16 on a CPU with it) the tolerance is bfloat16's: a plant
# must change the output by more than bf16's rounding does to diverge.
@pytest.mark.parametrize(("runtime", "factor"), [(OPENVINO, 4.0), (OPENVINO_F32, 1.05)],
                         ids=["default precision", "f32"])
def test_a_planted_weight_inside_a_fused_layer_is_narrowed_to_its_node(runtime, factor,
                                                                       fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("resnet_like")
    node, _ = plant(onnx_path, tmp_path / "planted.onnx",
                    scale_conv_weight("layer1.bn2", factor))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "planted.onnx",
                                runtime=runtime)
    assert report.culprit is not None and report.culprit.onnx_node == node, verdict_line(report)
    ran = report.to_dict()["culprit"]["node"]["ran_in"]
    # The Conv runs fused with the residual Add and the Relu: its own value is no
    # layer's output, and local runs on PyTorch's values pin it.
    assert ran["runtime"] == "openvino" and ran["layer"]["type"] == "Convolution"
    assert {node, "node_add", "node_relu_2"} <= set(ran["layer"]["nodes"])
    assert "getitem_6" not in {row.onnx_value for row in report.comparisons}
    line = verdict_line(report)
    assert (f"ran in OpenVINO's executed layer {ran['layer']['name']!r} (Convolution, "
            f"runtime precision {ran['layer']['runtime_precision']}") in line


def test_a_conv_fused_with_its_residual_add_is_classified_without_tracing(fixture_case,
                                                                         tmp_path):
    model, inputs, onnx_path = fixture_case("resnet_like")
    node, _ = plant(onnx_path, tmp_path / "planted.onnx", scale_conv_weight("layer1.bn2", 1.05))
    seen = []
    with events.listening(seen.append):
        report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "planted.onnx",
                                    runtime=OPENVINO_F32)
    # The residual input is no capture's value, so the kernel's check runs back past it
    # and no module call pins that segment; the Conv inside, fed PyTorch's values, is
    # rerun in float64 on its own (its BatchNorm's call), and no call is traced for it.
    assert report.culprit is not None and report.culprit.onnx_node == node, verdict_line(report)
    assert report.culprit.local.classification == "graph semantics", verdict_line(report)
    assert report.to_dict()["attribution"]["classification"]["kind"] == "graph semantics"
    assert report.coverage.granularity == "module"
    assert not [event for event in seen if "pytorch ops" in event.detail]


@pytest.mark.parametrize("node", ["node_MatMul_9", "node_MatMul_33"],
                         ids=["key projection", "first MLP Linear"])
def test_a_weight_whose_value_openvino_never_hands_out_is_found(fixture_case, tmp_path, node):
    model, inputs, onnx_path = fixture_case("tiny_transformer")
    plant(onnx_path, tmp_path / "planted.onnx", scale_initializer_input(node, 1, 1.05))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "planted.onnx",
                                runtime=OPENVINO_F32)
    # The Linear's output is asked for in no capture (it breaks a fold), nor is what
    # follows it up to the next captured value: the first failing value's own layer,
    # cut at PyTorch's value there, passes, and its check goes back to captured values.
    assert report.culprit is not None and report.culprit.onnx_node == node, verdict_line(report)
    assert report.culprit.onnx_value not in {row.onnx_value for row in report.comparisons}


def test_an_inserted_node_fused_with_the_one_before_is_named_as_inserted(fixture_case,
                                                                         tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    inserted, _ = plant(onnx_path, tmp_path / "inserted.onnx", insert_mul("node_relu", 1.5))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "inserted.onnx",
                                runtime=OPENVINO_F32)
    # OpenVINO runs the ReLU and the Mul in one layer: the ReLU's value is never
    # captured, so the Mul is the last node of the segment its check ran, and its
    # input, as the segment computed it, agrees with PyTorch's value after it.
    layer = report.to_dict()["culprit"]["node"]["ran_in"]["layer"]
    assert {"node_relu", inserted} <= set(layer["nodes"])
    assert report.culprit.onnx_node == inserted, verdict_line(report)
    assert "which has no counterpart in the reference" in verdict_line(report)


def test_a_planted_attribute_is_found_at_its_node(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("resnet_like")
    node, _ = plant(onnx_path, tmp_path / "planted.onnx",
                    set_attribute("up", "Resize", "mode", "nearest"))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "planted.onnx",
                                runtime=OPENVINO)
    assert report.culprit is not None and report.culprit.onnx_node == node, verdict_line(report)
    assert report.attribution.classification["kind"] == "graph semantics"
    layer = report.to_dict()["culprit"]["node"]["ran_in"]["layer"]
    assert layer["type"] == "Interpolate" and layer["nodes"] == [node]


def _runs_in_bf16() -> bool:
    side = _side("tiny_mlp", "bf16")
    return side.layer_of("node_linear").runtime_precision == "bf16"


def test_a_divergence_only_bf16_shows_is_found_where_bf16_ran():
    if not _runs_in_bf16():
        pytest.skip("this CPU runs OpenVINO's bf16 hint in f32 (no AVX-512 BF16 or AMX)")
    path, inputs = repo_path(FIXTURES["tiny_mlp"].onnx_file), _inputs("tiny_mlp")
    bf16 = bisect_onnx.RuntimeOptions(runtime="openvino", precision="bf16")
    # One file in ONNX Runtime (float32) against the same file in OpenVINO.
    report = bisect_onnx.bisect_onnx_models(path, inputs=inputs, candidate_runtime=bf16)
    assert report.diverged and report.culprit is not None, verdict_line(report)
    assert report.culprit.onnx_node == "node_linear"  # the first layer that rounds to bf16
    ran = report.to_dict()["culprit"]["node"]["ran_in"]
    assert ran["inference_precision"] == "bf16"
    assert ran["layer"]["runtime_precision"] == "bf16"
    assert "runtime precision bf16" in verdict_line(report)
    in_f32 = bisect_onnx.bisect_onnx_models(path, inputs=inputs, candidate_runtime=OPENVINO_F32)
    assert in_f32.verdict == "parity", verdict_line(in_f32)


def test_openvino_as_the_reference_against_onnx_runtime():
    path = repo_path(FIXTURES["resnet_like"].onnx_file)
    report = bisect_onnx.bisect_onnx_models(path, inputs=_inputs("resnet_like"),
                                            reference_runtime=OPENVINO_F32,
                                            candidate_runtime=bisect_onnx.RuntimeOptions())
    assert report.verdict == "parity", verdict_line(report)
    assert report.environment["reference_runtime"] == "openvino"
    assert report.environment["runtime"] == "onnxruntime"


def test_the_command_line_runs_one_file_in_onnx_runtime_against_openvino(tmp_path,
                                                                       monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    mlp = FIXTURES["tiny_mlp"]
    status = main([mlp.onnx_file, "--against", mlp.onnx_file, "--input", mlp.input_file,
                   "--against-runtime", "openvino", "--ov-precision", "f32",
                   "--json", str(tmp_path / "report.json"), "-q"])
    assert status == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["environment"]["runtime"] == "openvino"
    assert data["environment"]["reference_runtime"] == "onnxruntime"
    assert data["candidate"]["inference_precision"] == "f32"
    # The same runtime on both sides, nothing else different: nothing to compare.
    assert main([mlp.onnx_file, "--runtime", "openvino", "--against-runtime", "openvino"]) == 2


def test_the_pytorch_form_on_the_command_line_runs_in_openvino(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    pool = FIXTURES["avgpool_divisor"]  # diverges: AveragePool's divisor, in any runtime
    status = main([pool.factory, "--input", pool.input_file, "--onnx", pool.onnx_file,
                   "--runtime", "openvino", "--ov-precision", "f32",
                   "--json", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "ran in OpenVINO's executed layer 'node_avg_pool2d' (Pooling" in out
    # Nothing ran in ONNX Runtime: no sentence of the report says it did.
    assert "ONNX Runtime" not in out, out
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["culprit"]["node"]["ran_in"]["layer"]["nodes"] == ["node_avg_pool2d"]


def test_a_file_openvino_cannot_read_is_a_model_error_when_production_is_wanted(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "custom",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    path = tmp_path / "custom.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("com.example", 1)]), str(path))
    side = OpenVinoRunner(path, precision="f32")  # parsed: nothing compiled yet
    with pytest.raises(bisect_onnx.ModelError, match="OpenVINO could not read custom.onnx"):
        side.prepare()
    with pytest.raises(bisect_onnx.ModelError, match="OpenVINO could not read custom.onnx"):
        side.prepare()  # asked again, it says so again (read again, not a stale state)


def test_translations_are_imported_beside_openvino_only_where_production_diverges(
        fixture_case, monkeypatch, tmp_path):
    from bisect_onnx.pytorch import exporter_imports

    started = []
    monkeypatch.setattr(exporter_imports, "HIDDEN_FROM", 0)  # as for a large model
    monkeypatch.setattr(exporter_imports, "_TORCHLIB", "a.module.not.imported.yet")
    monkeypatch.setattr(exporter_imports, "preload_translations", lambda: started.append(1))
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=OPENVINO_F32)
    assert started == []  # at parity: its compilations take both cores, for nothing
    planted = tmp_path / "planted.onnx"
    matmul = next(node for node in onnx.load(str(onnx_path)).graph.node
                  if node.op_type in ("MatMul", "Gemm"))
    plant(onnx_path, planted, scale_initializer_input(matmul.name, 1, 1.05))
    assert bisect_onnx.bisect(model, inputs, onnx_model=planted, runtime=OPENVINO_F32).diverged
    assert started == [1]  # production's outputs diverged: imported beside the capture
    bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    assert started == [1, 1]  # ONNX Runtime makes its sessions on one core: imported then


def _integer_chain(tmp_path, direction: str):
    """x -> x*4 -> Floor -> int64 -> Abs -> uint64 -> BitShift by 1 -> float -> + x."""
    helper, tensor = onnx.helper, onnx.TensorProto
    nodes = [helper.make_node("Mul", ["x", "four"], ["scaled"], name="scale"),
             helper.make_node("Floor", ["scaled"], ["floored"], name="floor"),
             helper.make_node("Cast", ["floored"], ["whole"], to=tensor.INT64, name="to_int"),
             helper.make_node("Abs", ["whole"], ["size"], name="abs"),
             helper.make_node("Cast", ["size"], ["bits"], to=tensor.UINT64, name="to_uint"),
             helper.make_node("BitShift", ["bits", "one"], ["shifted"], direction=direction,
                              name="shift"),
             helper.make_node("Cast", ["shifted"], ["back"], to=tensor.FLOAT, name="to_float"),
             helper.make_node("Add", ["back", "x"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "integer_chain", [helper.make_tensor_value_info("x", tensor.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", tensor.FLOAT, [2, 8])],
        initializer=[helper.make_tensor("four", tensor.FLOAT, [], [4.0]),
                     helper.make_tensor("one", tensor.UINT64, [], [1])])
    path = tmp_path / f"{direction.lower()}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_a_node_of_an_integer_chain_openvino_hands_nothing_out_of_is_named(tmp_path):
    clean, planted = _integer_chain(tmp_path, "LEFT"), _integer_chain(tmp_path, "RIGHT")
    x = np.random.default_rng(0).uniform(-4, 4, (2, 8)).astype(np.float32)
    report = bisect_onnx.bisect_onnx_models(clean, planted, [x],
                                            candidate_runtime=OPENVINO_F32)
    # OpenVINO computes the chain in i32 and hands none of its values out; the clean
    # file's values of them (integers) name the node inside the layer that computed it.
    assert report.culprit is not None and report.culprit.onnx_node == "shift", \
        verdict_line(report)


def test_probes_of_production_compile_in_openvino(fixture_case):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    # A budget nothing fits in: production is probed a few values at a time.
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=bisect_onnx.
                                RuntimeOptions(runtime="openvino", precision="f32",
                                               max_memory=1))
    assert report.search.mode == "bisection"
    assert report.search.first_failing == "avg_pool2d"
    # Each probe's executed layers are compared with production's, layer by layer.
    assert all(probe.graph == "identical to production's"
               for probe in report.search.probes)
    assert report.culprit is not None and report.culprit.onnx_node == "node_avg_pool2d"


def test_a_culprit_call_torch_cannot_run_alone_leaves_the_report_standing(fixture_case,
                                                                          tmp_path):
    import onnx

    # Weights as external data: OpenVINO's local checks cannot read them, so the
    # module call holding the divergence, an in-place ReLU's, is traced alone; torch
    # cannot make a module of that program (it mutates its own input).
    model, inputs, onnx_path = fixture_case("inplace_relu")
    node, _ = plant(onnx_path, tmp_path / "planted.onnx", scale_conv_weight("conv1", 1.5))
    onnx.save_model(onnx.load(str(tmp_path / "planted.onnx")), str(tmp_path / "external.onnx"),
                    save_as_external_data=True, location="external.onnx.data",
                    size_threshold=0)
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "external.onnx",
                                runtime=OPENVINO_F32)
    assert report.diverged, verdict_line(report)
    assert report.first_divergence.onnx_node == "node_relu"  # what conv1's layer outputs


class _ChainToSoftplus(torch.nn.Module):
    """An einsum, an in-place scale-add-ReLU, activations, then a Softplus module: OpenVINO
    fuses the elementwise chain, so no value between the einsum and the Softplus is
    handed out (from benchmarks/corpus_grammar.py's seed 7)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.act = torch.nn.Softplus()

    def forward(self, x):
        x = torch.einsum("btd,de->bte", x, self.weight)
        y = x.clone()
        y.mul_(0.5)
        y.add_(x)
        y = torch.sigmoid(y.relu_())
        return self.act(torch.relu(y))


def test_a_call_whose_input_no_capture_holds_is_not_blamed_for_it(tmp_path):
    torch.manual_seed(0)
    model, x = _ChainToSoftplus().eval(), np.random.default_rng(0).standard_normal(
        (2, 8, 8)).astype(np.float32)
    clean = tmp_path / "model.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(clean), dynamo=True, opset_version=18)
    node, _ = plant(clean, tmp_path / "planted.onnx", scale_initializer_input("node_mul", 1, 1.05))
    report = bisect_onnx.bisect(model, x, onnx_model=tmp_path / "planted.onnx",
                                runtime=OPENVINO_F32)
    # Tracing the Softplus's call alone would check it back past its own op to the
    # model's input, and blame the Softplus for the scale that entered it.
    assert report.culprit is not None and report.culprit.onnx_node == node, verdict_line(report)


def test_the_tolerance_follows_the_precision_openvino_computes_in(fixture_case):
    """bf16 by default on a CPU with it: bfloat16's defaults, and the report says why."""
    model, inputs, onnx_path = fixture_case("resnet_like")
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=OPENVINO)
    computed = report.to_dict()["candidate"]["inference_precision"]
    if computed == "f32":  # a CPU without bf16: float32 it is
        assert report.tolerance_basis is None and report.rtol == 1e-3
    else:
        assert (report.rtol, report.atol) == (5e-2, 1e-2)
        assert report.tolerance_basis.startswith(f"bfloat16 defaults: OpenVINO computes in "
                                                 f"{computed}")
        assert "--ov-precision f32" in verdict_line(report)
    assert report.verdict == "parity", verdict_line(report)
    at_f32 = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=OPENVINO_F32)
    assert at_f32.tolerance_basis is None and at_f32.rtol == 1e-3
    given = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=OPENVINO,
                               tolerance=(1e-3, 1e-5))  # the user's own tolerance stands
    assert given.tolerance_basis is None and (given.rtol, given.atol) == (1e-3, 1e-5)
