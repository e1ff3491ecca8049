"""Exports made by the TorchScript exporter (``dynamo=False``): scopes in node names."""

from __future__ import annotations

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.planting import plant, scale_conv_weight, set_attribute, shift_bias

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
    assert by_module["layer1.bn1"].status == "pass"
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
    assert report.final_outputs[0].status == "fail", "the plant must change the output"
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
