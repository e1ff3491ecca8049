"""Recording a reference: what the archive holds, readable by numpy alone."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.reference.graph_digest import difference, graph_digest
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path


def test_archive_holds_every_row_readable_by_numpy_alone(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    path = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz", onnx_model=onnx_path)
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)

    with np.load(path, allow_pickle=False) as archive:  # no bisect-onnx needed to read it
        manifest = json.loads(archive["manifest.json"])
        assert (manifest["format"], manifest["version"]) == ("bisect-onnx-reference", 1)
        values = {entry["name"]: archive[entry["member"][:-4]]
                  for entry in manifest["values"]}
        recorded_input = archive[manifest["inputs"][0]["member"][:-4]]
    np.testing.assert_array_equal(recorded_input, inputs["x"])
    # Every row of the report, and the final outputs, under their ONNX value names.
    assert {row.onnx_value for row in report.comparisons} <= set(values)
    assert {row.onnx_value for row in report.final_outputs} <= set(values)
    rows = manifest["rows"]
    assert [(row["onnx_value"], row["torch_module"], row["torch_op"], row["fx_node"])
            for row in rows] == [(row.onnx_value, row.torch_module, row.torch_op, row.fx_node)
                                 for row in report.comparisons]
    assert rows[1]["source"]["line"] == report.comparisons[1].source.line
    assert manifest["tolerance"] == {"rtol": 1e-3, "atol": 1e-5, "basis": None,
                                     "given_rtol": None, "given_atol": None}
    assert manifest["environment"]["torch"] == report.environment["torch"]
    assert manifest["environment"]["exporter"] == "dynamo"
    assert manifest["recorded"]["culprit"]["onnx_node"] == "node_avg_pool2d"
    assert manifest["onnx"] == {"path": str(onnx_path.resolve())}
    digest = graph_digest(onnx.load(str(onnx_path)), onnx_path.parent)
    assert manifest["graph"]["sha256"] == digest.sha256
    # PyTorch's values, not the runtime's: the pool's divisor is PyTorch's.
    assert report.comparisons[1].figures.max_abs_error > 0.1


def test_an_export_made_here_is_kept_inside(fixture_case, tmp_path):
    model, inputs, _ = fixture_case("tiny_mlp")
    path = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz")
    with zipfile.ZipFile(path) as archive:
        assert "model.onnx" in archive.namelist()
        onnx.checker.check_model(onnx.load_from_string(archive.read("model.onnx")))
    assert bisect_onnx.Reference.load(path).manifest.onnx == {"member": "model.onnx"}


def test_one_input_set_only(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    with pytest.raises(bisect_onnx.UsageError, match="one input set"):
        bisect_onnx.record(model, bisect_onnx.Samples([inputs, inputs]),
                           path=tmp_path / "ref.npz", onnx_model=onnx_path)
    with pytest.raises(bisect_onnx.UsageError, match="one input set"):
        bisect_onnx.record(model, bisect_onnx.RandomInputs(samples=2),
                           path=tmp_path / "ref.npz", onnx_model=onnx_path)
    assert not (tmp_path / "ref.npz").exists()


def test_record_is_never_written_over_an_input(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    with pytest.raises(bisect_onnx.UsageError):
        bisect_onnx.record(model, inputs, path=onnx_path, onnx_model=onnx_path)


def test_command_line_records_and_prints_the_report(tmp_path, capsys, monkeypatch):
    fixture = FIXTURES["avgpool_divisor"]
    monkeypatch.chdir(REPO_ROOT)
    args = [fixture.factory, "--input", fixture.input_file, "--onnx", fixture.onnx_file]
    status = main([*args, "--record", str(tmp_path / "ref.npz"), "-q"])
    assert status == 1
    assert "DIVERGED" in capsys.readouterr().out
    manifest = bisect_onnx.Reference.load(tmp_path / "ref.npz").manifest
    assert manifest.command == "bisect-onnx " + " ".join([*args, "-q"])


def test_record_with_two_onnx_models_records_the_reference_file(tmp_path, capsys):
    onnx_path = repo_path(FIXTURES["tiny_mlp"].onnx_file)
    status = main([str(onnx_path), "--against-opt-level", "basic", "--record",
                   str(tmp_path / "ref.npz")])
    assert status == 0
    manifest = bisect_onnx.Reference.load(tmp_path / "ref.npz").manifest
    assert manifest.reference_kind == "onnx"
    assert manifest.onnx == {"path": str(onnx_path.resolve())}


def test_graph_digest_is_the_graph_not_the_bytes(tmp_path):
    source = repo_path(FIXTURES["tiny_mlp"].onnx_file)
    model = onnx.load(str(source))
    recorded = graph_digest(model, source.parent)
    # Saved again with its weights outside, its metadata stripped: the same graph.
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()),
              str(tmp_path / "moved.onnx"), save_as_external_data=True,
              size_threshold=0, location="moved.data")
    moved = onnx.load(str(tmp_path / "moved.onnx"), load_external_data=False)
    assert difference(recorded, graph_digest(moved, tmp_path)) is None
    # Another weight value, another node: each named.
    weight = model.graph.initializer[0]
    array = onnx.numpy_helper.to_array(weight) + 1
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    assert difference(recorded, graph_digest(model, tmp_path)) == (
        f"initializer {weight.name!r} holds other values")
    model.graph.node[0].op_type = "Sigmoid"
    assert "node 0" in difference(recorded, graph_digest(model, tmp_path))


def test_the_look_inside_a_torchscript_op_is_recorded(tmp_path):
    import torch

    class TwoLinears(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(torch.relu(self.first(x)))

    model = TwoLinears().eval()
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    path = tmp_path / "model.onnx"
    matmul = _exported_with_scaled_weight(model, x, path, "MatMul")
    op_level = bisect_onnx.SearchOptions(granularity="op")
    report = bisect_onnx.bisect(model, x, onnx_model=path, search=op_level)
    # The linear op's value goes wrong at its Add; the look inside it names the MatMul.
    assert report.inside_op is not None and report.inside_op.node == matmul.name
    assert report.culprit.onnx_node == matmul.name
    reference = bisect_onnx.record(model, x, path=tmp_path / "ref.npz", onnx_model=path,
                                   search=op_level)
    assert matmul.output[0] in bisect_onnx.Reference.load(reference).value_names
    checked = bisect_onnx.check(reference)
    assert (checked.culprit.onnx_node, checked.culprit.onnx_value) == (
        matmul.name, report.inside_op.value)


def test_a_torchscript_ops_value_inside_a_fused_kernel_is_recorded(tmp_path):
    import torch

    class ConvInside(torch.nn.Module):  # a functional conv: no module output of its own
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.weight = torch.nn.Parameter(torch.randn(8, 3, 3, 3) * 0.3)
            self.bias = torch.nn.Parameter(torch.randn(8) * 0.1)
            self.head = torch.nn.Linear(8 * 6 * 6, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(torch.nn.functional.conv2d(x, self.weight, self.bias))
            return self.head(torch.tanh(y * 2.0).flatten(1))

    model = ConvInside().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    path = tmp_path / "model.onnx"
    conv = _exported_with_scaled_weight(model, x, path, "Conv")
    op_level = bisect_onnx.SearchOptions(granularity="op")
    report = bisect_onnx.bisect(model, x, onnx_model=path, search=op_level)
    # ONNX Runtime fuses the Conv with its Relu: the conv op's value, traced, names it.
    assert (report.culprit.onnx_node, report.culprit.onnx_value) == (conv.name, conv.output[0])
    reference = bisect_onnx.record(model, x, path=tmp_path / "ref.npz", onnx_model=path,
                                   search=op_level)
    checked = bisect_onnx.check(reference)
    assert (checked.culprit.onnx_node, checked.culprit.onnx_value) == (conv.name,
                                                                        conv.output[0])


def _exported_with_scaled_weight(model, x: np.ndarray, path: Path, op_type: str):
    """``model`` exported by the TorchScript exporter to ``path``, the weight (input 1) of
    its first ``op_type`` node scaled by 1.5 in place: that node."""
    from onnx import numpy_helper

    bisect_onnx.bisect(model, x, export=bisect_onnx.ExportOptions(exporter="torchscript",
                                                                  save_to=path))
    exported = onnx.load(str(path))
    node = next(node for node in exported.graph.node if node.op_type == op_type)
    weight = next(tensor for tensor in exported.graph.initializer
                  if tensor.name == node.input[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(exported, str(path))
    return node
