"""Exports made by the TorchScript exporter (``dynamo=False``): scopes in node names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import bisect_onnx
from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.planting import plant, scale_conv_weight, set_attribute, shift_bias
from tests.torch_warnings import TORCH_JIT_DEPRECATED

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")


def run(fixture_case, name, onnx_path=None, promote="fused"):
    model, inputs, _ = fixture_case(name)
    onnx_path = onnx_path or repo_path(FIXTURES[name].torchscript_onnx_file)
    # Module level: what these tests check is how module calls meet TorchScript nodes
    # (a dynamo file given here would otherwise be compared op by op). ``promote="all"``
    # where a test looks at values ONNX Runtime would fuse away.
    return bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, search=MODULE_ROWS,
                              runtime=bisect_onnx.RuntimeOptions(promote=promote))


@pytest.mark.parametrize("name", ["tiny_mlp", "resnet_like", "tiny_transformer", "inplace_relu",
                                  "two_inputs", "reused_block", "dropout_mlp"])
def test_faithful_torchscript_exports_raise_no_false_alarm(fixture_case, name):
    report = run(fixture_case, name)
    assert report.environment["exporter"] == "torchscript"
    assert report.verdict == "parity"
    assert report.hidden_divergences == []
    assert report.coverage.aligned_modules > 0


def test_folded_batchnorm_is_compared_as_the_batchnorm_not_the_conv(fixture_case):
    report = run(fixture_case, "resnet_like", promote="all")
    by_module = {record.torch_module: record for record in report.comparisons}
    # The fused node keeps the Conv's name but computes the BatchNorm's output.
    assert by_module["layer1.bn1"].onnx_node == "/layer1/conv1/Conv"
    assert by_module["layer1.bn1"].figures.status == "pass"
    assert "layer1.conv1" not in by_module
    reasons = {item.name: item.reason for item in report.unaligned}
    assert "folded with the BatchNorm" in reasons["layer1.conv1"]


def test_reused_module_calls_follow_the_call_suffixes(fixture_case):
    report = run(fixture_case, "reused_block")
    nodes = {record.torch_module: record.onnx_node for record in report.comparisons}
    assert nodes["block.tanh"] == "/block/tanh/Tanh"
    assert nodes["block.tanh@2"] == "/block/tanh_2/Tanh"
    assert nodes["act@1"] == "/act_1/Relu"


TORCHSCRIPT_PLANTS = [
    ("resnet_like", scale_conv_weight("/layer2/conv1/Conv", 1.003), "layer2.bn1"),
    ("tiny_transformer", set_attribute("/blocks.1/ln2/LayerNormalization",
                                       "LayerNormalization", "epsilon", 1e-3), "blocks.1.ln2"),
    ("dropout_mlp", shift_bias("/fc2/Gemm", "Gemm", 0.01), "fc2"),
    ("dropout_mlp", shift_bias("/fc1/Gemm", "Gemm", 0.01), "fc1"),
]


@pytest.mark.parametrize(("name", "edit", "module"), TORCHSCRIPT_PLANTS,
                         ids=["conv-weight", "layernorm-epsilon", "after-dropout",
                              "before-dropout"])
def test_planted_edit_in_a_torchscript_export_is_reported_at_its_module(
        fixture_case, tmp_path, name, edit, module):
    planted = tmp_path / "planted.onnx"
    node_name, _ = plant(repo_path(FIXTURES[name].torchscript_onnx_file), planted, edit)
    report = run(fixture_case, name, planted)
    assert report.final_outputs[0].figures.status == "fail", "the plant must change the output"
    # The culprit, also where ONNX Runtime fused the planted node into a kernel whose
    # output is the first divergence.
    culprit = report.culprit
    assert culprit.onnx_node == node_name
    assert culprit.torch_module == module
    assert all(not record.failed for record in report.comparisons[: report.first_divergence.index])


def test_eval_dropout_is_compared_at_the_value_it_passed_through(fixture_case, tmp_path):
    planted = tmp_path / "planted.onnx"
    plant(repo_path(FIXTURES["dropout_mlp"].onnx_file), planted, shift_bias("fc1", "Gemm", 0.01))
    for onnx_path in (planted, None):
        report = run(fixture_case, "dropout_mlp", onnx_path, promote="all")
        by_module = {record.torch_module: record for record in report.comparisons}
        assert by_module["drop"].onnx_value == by_module["act"].onnx_value
    # The planted run (dynamo export): the error shows first at fc1, then at act and drop.
    planted_report = run(fixture_case, "dropout_mlp", planted, promote="all")
    assert planted_report.first_divergence.torch_module == "fc1"
    failing = [record.torch_module for record in planted_report.comparisons if record.failed]
    assert failing[:3] == ["fc1", "act", "drop"]


def test_cli_exports_with_the_torchscript_exporter(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    fixture = FIXTURES["resnet_like"]
    status = main([fixture.factory, "--input", fixture.input_file, "--exporter", "torchscript",
                   "--json", str(tmp_path / "r.json")])
    assert status == 0
    assert '"exporter": "torchscript"' in (tmp_path / "r.json").read_text()
    assert "layer1.bn1" in capsys.readouterr().out


class SequentialNet(torch.nn.Module):
    """Numeric children: a traced archive's export scopes them ``/body/0/Conv``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1))
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.pool(self.body(x)).flatten(1))


@pytest.fixture
def traced_sequential(tmp_path):
    """The module, its traced archive, an input, and the archive's own export."""
    torch.manual_seed(0)
    model = SequentialNet().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    archive = tmp_path / "archive.pt"
    torch.jit.save(torch.jit.trace(model, torch.from_numpy(x)), archive)
    exported = tmp_path / "archive.onnx"
    bisect_onnx.bisect(str(archive), x, export=bisect_onnx.ExportOptions(save_to=exported))
    return model, archive, x, exported


SEQUENTIAL_CHILDREN = {"body.0", "body.1", "body.2"}


@TORCH_JIT_DEPRECATED
def test_a_traced_archives_sequential_children_are_aligned_by_their_scopes(traced_sequential):
    model, archive, x, exported = traced_sequential
    assert "/body/0/Conv" in {node.name for node in onnx.load(str(exported)).graph.node}
    paths = {name for name, _ in model.named_modules() if name}
    compared = {}
    for form in (str(archive), model):
        report = bisect_onnx.bisect(form, x, onnx_model=exported, search=MODULE_ROWS,
                                    runtime=bisect_onnx.RuntimeOptions(promote="all"))
        assert report.verdict == "parity"
        assert not [item for item in report.unaligned if item.name in SEQUENTIAL_CHILDREN]
        compared[type(form).__name__] = {record.torch_module for record in report.comparisons
                                         if record.torch_module in paths}
    assert SEQUENTIAL_CHILDREN <= compared["str"]
    # The module form's hooks also record a module's input ("head (input)"); its
    # module rows are the archive's.
    assert compared["str"] == compared["SequentialNet"]


@TORCH_JIT_DEPRECATED
def test_a_planted_weight_in_a_traced_archives_sequential_is_found_at_its_conv(
        traced_sequential, tmp_path):
    model, archive, x, exported = traced_sequential
    planted = tmp_path / "planted.onnx"
    node_name, _ = plant(exported, planted, scale_conv_weight("/body/2/Conv", 1.5))
    for form in (str(archive), model):
        report = bisect_onnx.bisect(form, x, onnx_model=planted)
        assert report.verdict == "diverged"
        assert report.culprit is not None, report.summary()
        assert (report.culprit.onnx_node, report.culprit.torch_module) == (node_name, "body.2")
