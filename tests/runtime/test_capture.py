"""Capture under the production kernels: fusion-preserving promotion, levels, NaN origin."""

from __future__ import annotations

import json
import os
import platform

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn
from torch.nn import functional as F

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import InputError
from bisect_onnx.runtime.onnxruntime.capture_plan import op_counts
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from bisect_onnx.runtime.onnxruntime.sessions import create_session
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant, scale_conv_weight

OP_ROWS = bisect_onnx.SearchOptions(granularity="op")


class Fusable(nn.Module):
    """Conv+ReLU, MatMul+Add, LayerNorm and an erf GELU: all fused by ONNX Runtime."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 64)
        self.norm = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


@pytest.fixture(scope="module")
def fusable(tmp_path_factory):
    model = Fusable().eval()
    x = np.random.RandomState(0).randn(2, 3, 8, 8).astype(np.float32)
    path = tmp_path_factory.mktemp("fusable") / "fusable.onnx"
    bisect_onnx.bisect(model, x, export=bisect_onnx.ExportOptions(opset=18, save_to=path))
    return model, x, path


def _optimized_ops(serialized: bytes, folder, name: str, model_dir) -> dict[str, int]:
    path = folder / f"{name}.onnx"
    create_session(serialized, model_dir=model_dir, label=name, optimized_path=path)
    return op_counts(onnx.load(str(path), load_external_data=False))


def test_fusion_preserving_capture_fuses_as_production_and_promoting_all_does_not(
        fusable, tmp_path):
    _, x, path = fusable
    side = OnnxRuntimeRunner(path)
    ran = side.run([x])
    plan = side.plan
    production = plan.production_ops
    original = {node.op_type for node in side.model.graph.node}
    assert {op for op in production if op not in original}, "ORT fused nothing"
    assert plan.capture_ops == production
    assert side.describe_capture(ran.production)["fusions_match_production"] is True
    assert ran.production.matches is True
    # Node for node production's graph: production is not run again, and a production
    # session does give the very same outputs.
    assert plan.same_graph_as_production
    assert ran.production.how == "identical optimized graph"
    session = create_session(path, model_dir=path.parent, label="production")
    expected = session.run(None, {side.inputs[0].name: x})
    assert all(np.array_equal(ours, theirs)
               for ours, theirs in zip(ran.production.outputs, expected, strict=True))
    # Every node output promoted: ORT can no longer fuse what feeds a graph output.
    # (its weights read from the model's folder, where they lie)
    everything = _optimized_ops(side.promoted_bytes(None), tmp_path, "all", path.parent)
    assert everything != production
    assert sum(everything.values()) > sum(production.values())


def test_promote_all_keeps_the_plain_capture(fusable):
    model, x, path = fusable
    fused = bisect_onnx.bisect(model, x, onnx_model=path, search=OP_ROWS)
    plain = bisect_onnx.bisect(model, x, onnx_model=path, search=OP_ROWS,
                               runtime=bisect_onnx.RuntimeOptions(promote="all"))
    assert fused.capture["mode"] == "fusion-preserving"
    assert plain.capture["mode"] == "all values"
    assert fused.verdict == plain.verdict == "parity"
    assert plain.coverage.onnx_values > fused.coverage.onnx_values
    runtime_fused = [item for item in fused.unaligned if item.kind == "runtime-fused"]
    assert runtime_fused and "--promote all" in runtime_fused[0].reason


@pytest.mark.parametrize("level", ["all", "extended"])
def test_planted_edit_found_at_both_levels_and_the_json_says_how(level, fixture_case,
                                                                 tmp_path):
    fixture = FIXTURES["resnet_like"]
    planted = tmp_path / "planted.onnx"
    plant(repo_path(fixture.onnx_file), planted, scale_conv_weight("layer2.bn1", 1.003))
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   "--onnx", str(planted), "--opt-level", level, "-q",
                   "--json", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert status == 1
    # Where ONNX Runtime fused the Conv with the ReLU after it, only the ReLU's output is
    # captured: it is the first divergence, and the culprit inside it is the Conv.
    assert report["culprit"]["torch_module"] == "layer2.bn1"
    assert report["culprit"]["onnx_op"] == "Conv"
    assert report["environment"]["opt_level"] == level
    capture = report["capture"]
    assert capture["mode"].startswith("fusion-preserving")
    assert capture["fusions_match_production"] is True
    assert isinstance(capture["outputs_match_production"], bool)
    if capture["disabled_optimizers"]:  # x86: the NCHWc layout transformer renamed values
        assert level == "all" and "NCHWc" in capture["mode"]
        # Another graph than production's: production's outputs come from a run of it.
        assert capture["production_check"] == "outputs compared bitwise"


def test_an_unavailable_provider_is_a_one_line_error(capsys):
    fixture = FIXTURES["tiny_mlp"]
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   "--onnx", str(repo_path(fixture.onnx_file)),
                   "--provider", "CUDAExecutionProvider"])
    error = capsys.readouterr().err.strip()
    assert status == 2
    assert len(error.splitlines()) == 1
    assert "CUDAExecutionProvider" in error and "CPUExecutionProvider" in error


class RootOfSum(nn.Module):
    """``sqrt(relu(fc1(x)) + 1)``: NaN-free in PyTorch whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.sqrt(torch.relu(self.fc1(x)) + 1.0))


def test_nan_on_one_side_is_reported_where_it_starts(tmp_path):
    model = RootOfSum().eval()
    x = np.random.RandomState(0).randn(8, 16).astype(np.float32)
    exported = tmp_path / "model.onnx"
    bisect_onnx.bisect(model, x, export=bisect_onnx.ExportOptions(opset=18, save_to=exported))
    proto = onnx.load(str(exported))
    initializers = {init.name: init for init in proto.graph.initializer}
    # A small-margin error first (fc1's bias nudged), then a NaN: the Add's constant 1
    # becomes -1, so ONNX takes the root of negative numbers.
    fc1 = next(node for node in proto.graph.node if node.op_type in ("Gemm", "Add")
               and any(name.endswith("fc1.bias") for name in node.input))
    bias = initializers[next(name for name in fc1.input if name.endswith("fc1.bias"))]
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(2e-3),
                                          bias.name))
    sqrt = next(node for node in proto.graph.node if node.op_type == "Sqrt")
    add = next(node for node in proto.graph.node if sqrt.input[0] in node.output)
    one = next(name for name in add.input if name in initializers)
    initializers[one].CopyFrom(numpy_helper.from_array(
        -numpy_helper.to_array(initializers[one]), one))
    onnx.save(proto, str(tmp_path / "planted.onnx"))

    report = bisect_onnx.bisect(model, x, onnx_model=tmp_path / "planted.onnx")
    assert report.verdict == "diverged"
    assert report.first_divergence.figures.nan_mismatch == 0  # the nudge fails first
    origin = report.nan_origin
    assert origin is not None and origin.figures.nan_mismatch > 0
    assert origin.fx_node == "sqrt" and origin.onnx_op == "Sqrt"
    assert "NaN/Inf first appears on one side only" in report.summary()
    assert report.to_dict()["nan_origin"]["onnx_value"] == origin.onnx_value


def test_the_layout_transformer_is_disabled_only_where_it_rewrote_the_graph(monkeypatch):
    from bisect_onnx.runtime.onnxruntime import capture_plan

    # As if every model lost most of its value names: only a graph the NCHWc
    # transformer rewrote (a CNN on x86) is captured without it.
    monkeypatch.setattr(capture_plan, "_SURVIVAL_FLOOR", 1.01)
    plans = {}
    for name in ("tiny_mlp", "resnet_like"):
        path = repo_path(FIXTURES[name].onnx_file)
        plans[name] = capture_plan.plan_capture(onnx.load(str(path)), path, promote="fused",
                                                provider="CPUExecutionProvider",
                                                opt_level="all", label=path.name)
    assert plans["tiny_mlp"].disabled_optimizers == []
    assert plans["tiny_mlp"].mode == "fusion-preserving"
    if platform.machine().lower() in ("x86_64", "amd64"):  # where NCHWc kernels exist
        assert plans["resnet_like"].disabled_optimizers == [capture_plan.NCHWC_TRANSFORMER]


def test_the_promoted_model_leaves_the_files_weights_where_they_lie(tmp_path):
    from onnx.external_data_helper import load_external_data_for_model

    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    runner = OnnxRuntimeRunner(path)
    wanted = {"relu", "relu_1"}
    promoted = runner.promoted_bytes(wanted)
    # The large weights are read from the file where they lie, not serialized again.
    assert len(promoted) < path.stat().st_size / 2
    model = onnx.load_from_string(promoted)
    referenced = [tensor for tensor in model.graph.initializer
                  if tensor.data_location == onnx.TensorProto.EXTERNAL]
    assert referenced and {entry.value for tensor in referenced
                           for entry in tensor.external_data
                           if entry.key == "location"} == {path.name}
    assert [value.name for value in model.graph.output] == ["linear", "relu", "relu_1"]
    load_external_data_for_model(model, str(tmp_path))
    for tensor in model.graph.initializer:  # (loading sets it, to its default)
        tensor.ClearField("data_location")
    expected = onnx.load(str(path))  # the file parsed whole, its weights inline
    expected.graph.output.extend(onnx.ValueInfoProto(name=name) for name in ("relu", "relu_1"))
    assert model == expected
    # ONNX Runtime computes the same values, bitwise, as from the model serialized.
    x = np.load(repo_path(FIXTURES["resnet_like"].input_file))
    ours = create_session(promoted, model_dir=tmp_path, label="in place").run(None, {"x": x})
    theirs = create_session(expected.SerializeToString(), model_dir=tmp_path,
                            label="serialized").run(None, {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    # Production too is made on the file's weights where they lie.
    production = runner.file_source()
    assert isinstance(production, bytes) and len(production) < path.stat().st_size / 2
    ours = create_session(production, model_dir=tmp_path, label="in place").run(None, {"x": x})
    theirs = create_session(path, model_dir=tmp_path, label="file").run(None, {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    # The model read references the file's weights: a file written since is refused,
    # never mixed with the graph as it was read.
    path.write_bytes(b"written since")
    for source in (runner.file_source, lambda: runner.promoted_bytes(wanted)):
        with pytest.raises(InputError, match="written again while it was compared"):
            source()
    assert [value.name for value in runner.model.graph.output] == ["linear"]


def test_local_checks_read_the_files_weights_where_they_lie(tmp_path, monkeypatch):
    from bisect_onnx.judge.tolerances import Tolerance
    from bisect_onnx.search.local import run_locally

    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    x = np.load(repo_path(FIXTURES["resnet_like"].input_file))
    runner = OnnxRuntimeRunner(path, promote="all")
    values = {name: value.array for name, value in runner.run([x]).capture.values.items()}
    checked = [name for name in values if name != runner.output_names[0]]
    sizes = []
    local_session = runner.local_session
    monkeypatch.setattr(runner, "local_session", lambda serialized, label: (
        sizes.append(len(serialized)), local_session(serialized, label))[1])

    def local_values() -> dict[str, dict[str, np.ndarray]]:
        checks = run_locally(runner, checked, reference_values=values, candidate_values=values,
                             graph_inputs={"x": x}, tolerance=Tolerance(1e-3, 1e-5))
        return {name: check.values for name, check in checks.items()}

    in_place = local_values()
    monkeypatch.setattr(runner, "initializers_in_place", lambda: None)  # copied, as before
    copied = local_values()
    # The weights referenced, not copied in: the same values, bitwise, from a model a
    # fraction of the size. (The runner's own model references them too, so a copy of
    # its initializers is as small.)
    assert max(sizes) < path.stat().st_size / 2 and all(in_place.values())
    assert in_place.keys() == copied.keys() and all(
        local.keys() == copied[name].keys()
        and all(np.array_equal(array, copied[name][value])
                for value, array in local.items()) for name, local in in_place.items())
    # A file written since is not the model read: refused, nothing of it referenced.
    path.write_bytes(b"written since")
    monkeypatch.undo()
    with pytest.raises(InputError, match="written again while it was compared"):
        runner.initializers_in_place()


def test_weights_said_to_be_inline_are_read_where_they_lie_too(tmp_path):
    # onnx writes ``data_location: DEFAULT`` on a weight it read back from external data.
    model = onnx.load(str(repo_path(FIXTURES["resnet_like"].onnx_file)))
    for tensor in model.graph.initializer:
        tensor.data_location = onnx.TensorProto.DEFAULT
    path = tmp_path / "said_inline.onnx"
    onnx.save(model, str(path))
    source = OnnxRuntimeRunner(path).file_source()
    assert isinstance(source, bytes) and len(source) < path.stat().st_size / 2
    referenced = [tensor for tensor in onnx.load_from_string(source).graph.initializer
                  if tensor.data_location == onnx.TensorProto.EXTERNAL]
    assert referenced and all(not tensor.raw_data for tensor in referenced)


def test_the_model_is_read_with_its_weights_where_they_lie(tmp_path):
    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    runner = OnnxRuntimeRunner(path)
    referenced = [tensor for tensor in runner.model.graph.initializer
                  if tensor.data_location == onnx.TensorProto.EXTERNAL]
    # Each large weight is a reference into the file itself, never copied out of it.
    assert referenced and all(not tensor.raw_data for tensor in referenced)
    assert {entry.value for tensor in referenced for entry in tensor.external_data
            if entry.key == "location"} == {path.name}
    whole = onnx.load(str(path))
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(runner.model, str(tmp_path))
    for tensor in runner.model.graph.initializer:
        tensor.ClearField("data_location")
    assert runner.model == whole


def test_a_file_with_other_hard_links_is_read_whole(tmp_path):
    # onnx refuses to read external data from a file with several hard links: such a
    # file's weights stay inline in the model read, and every reader of them works.
    from bisect_onnx.reference.graph_digest import graph_digest

    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    os.link(path, tmp_path / "linked.onnx")
    runner = OnnxRuntimeRunner(path)
    assert not any(tensor.data_location == onnx.TensorProto.EXTERNAL
                   for tensor in runner.model.graph.initializer)
    assert graph_digest(runner.model, tmp_path) == graph_digest(onnx.load(str(path)), tmp_path)


def test_a_model_not_read_in_place_is_promoted_without_being_changed(tmp_path, monkeypatch):
    import bisect_onnx.runtime.onnxruntime.runner as ort_runner

    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    runner = OnnxRuntimeRunner(path)
    before = runner.model.SerializeToString()
    monkeypatch.setattr(ort_runner, "weights_in_place", lambda *_: None)  # (unexpected bytes)
    promoted = onnx.load_from_string(runner.promoted_bytes({"relu"}))
    assert [value.name for value in promoted.graph.output] == ["linear", "relu"]
    assert runner.model.SerializeToString() == before
