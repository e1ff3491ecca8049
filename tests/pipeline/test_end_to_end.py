"""End to end through the Python API: real exports, real ONNX Runtime sessions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bisect_onnx
from bisect_onnx.report.json import to_json
from fixtures.registry import repo_path
from tests.planting import plant, scale_conv_weight, set_attribute

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")
OP_ROWS = bisect_onnx.SearchOptions(granularity="op")

#: Every node output promoted, for tests that look at values ONNX Runtime fuses away.
ALL_VALUES = bisect_onnx.RuntimeOptions(promote="all")


def run(fixture_case, name, onnx_path=None, **options):
    model, inputs, exported = fixture_case(name)
    return bisect_onnx.bisect(model, inputs, onnx_model=onnx_path or exported, **options)


@pytest.mark.parametrize("name", ["tiny_mlp", "resnet_like", "tiny_transformer", "inplace_relu",
                                  "two_inputs", "reused_block"])
def test_faithful_exports_are_in_parity_with_no_false_alarm(fixture_case, name):
    report = run(fixture_case, name)
    assert report.verdict == "parity"
    assert report.first_divergence is None
    assert report.hidden_divergences == []
    assert report.coverage.aligned_modules > 0
    assert all(record.figures.status == "pass" for record in report.comparisons)


# Each plant is small: just over the default tolerance, as real exporter bugs often are.
PLANTS = [
    ("resnet_like", scale_conv_weight("layer2.bn1", 1.003), "layer2.bn1"),
    ("tiny_transformer",
     set_attribute("blocks.1.ln2", "LayerNormalization", "epsilon", 1e-3), "blocks.1.ln2"),
    ("resnet_like",
     set_attribute("up", "Resize", "coordinate_transformation_mode", "asymmetric"), "up"),
]


@pytest.mark.parametrize(("name", "edit", "module"), PLANTS,
                         ids=["conv-weight", "layernorm-epsilon", "resize-coordinates"])
def test_planted_edit_is_reported_at_its_module(fixture_case, tmp_path, name, edit, module):
    _, _, exported = fixture_case(name)
    planted = tmp_path / "planted.onnx"
    node_name, node_module = plant(exported, planted, edit)
    assert node_module == module

    clean = run(fixture_case, name)
    report = run(fixture_case, name, planted)

    # The plant must actually change the final output, or the test proves nothing.
    assert clean.final_outputs[0].figures.status == "pass"
    assert report.final_outputs[0].figures.status == "fail"
    assert report.verdict == "diverged"
    # The culprit is the planted node, even where ONNX Runtime fused it into a kernel
    # whose output (a Conv's ReLU, say) is all the production session computes.
    culprit = report.culprit
    assert culprit.onnx_node == node_name
    assert culprit.torch_module == module
    assert culprit.local.introduced_here is True
    # Everything before the first divergence still passes.
    first = report.first_divergence
    assert all(not record.failed for record in report.comparisons[: first.index])


def test_avgpool_divisor_override_is_reported_at_the_pool(fixture_case):
    report = run(fixture_case, "avgpool_divisor")
    assert report.verdict == "diverged"
    assert report.first_divergence.torch_module == "pool"
    assert report.first_divergence.onnx_op == "AveragePool"
    assert report.first_divergence.torch_op == "aten.avg_pool2d.default"
    assert report.first_divergence.source.file.endswith("fixtures/models.py")
    source_line = repo_path(report.first_divergence.source.file).read_text().splitlines()[
        report.first_divergence.source.line - 1]
    assert "self.pool" in source_line


def test_inplace_relu_does_not_corrupt_the_recorded_conv_output(fixture_case):
    # Every value promoted: ONNX Runtime would fuse the Conv with the ReLU after it.
    report = run(fixture_case, "inplace_relu", runtime=ALL_VALUES)
    conv = next(record for record in report.comparisons if record.torch_module == "conv1")
    assert conv.figures.status == "pass"
    model, inputs, _ = fixture_case("inplace_relu")
    with torch.no_grad():
        raw = model.conv1(torch.from_numpy(inputs["x"]))
    assert raw.min() < 0, "conv1 must produce negatives for this test to mean anything"


def test_reused_module_calls_align_to_their_own_nodes(fixture_case):
    report = run(fixture_case, "reused_block", search=MODULE_ROWS)
    by_module = {record.torch_module: record for record in report.comparisons}
    assert [by_module[f"block{suffix}"].onnx_value for suffix in ("", "@1", "@2")] == [
        "tanh", "tanh_1", "tanh_2"]
    assert by_module["act"].onnx_value != by_module["act@1"].onnx_value


def test_reused_relu_calls_split_in_resnet(fixture_case):
    report = run(fixture_case, "resnet_like", search=MODULE_ROWS, runtime=ALL_VALUES)
    values = {record.torch_module: record.onnx_value for record in report.comparisons}
    assert values["layer1.relu"] != values["layer1.relu@1"]
    # Folded BatchNorm: the fused Conv's output belongs to the BatchNorm, the conv has no row.
    assert "layer1.bn1" in values and "layer1.conv1" not in values
    assert any(item.name == "layer1.conv1" for item in report.unaligned)


def test_two_inputs_from_npz_keys_and_tuple_output(fixture_case):
    model, inputs, exported = fixture_case("two_inputs")
    reordered = {"y": inputs["y"], "x": inputs["x"]}  # key order must not matter
    report = bisect_onnx.bisect(model, reordered, onnx_model=exported)
    assert report.verdict == "parity"
    assert len(report.final_outputs) == 2


def test_second_output_divergence_counts(fixture_case, tmp_path):
    import onnx
    from onnx import numpy_helper

    model, inputs, exported = fixture_case("two_inputs")
    proto = onnx.load(str(exported))
    c_node = next(n for n in proto.graph.node if n.output[0] == proto.graph.output[1].name)
    bias = next(i for i in proto.graph.initializer if i.name == c_node.input[2])
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(0.5), bias.name))
    onnx.save(proto, str(tmp_path / "m.onnx"))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "m.onnx")
    assert report.verdict == "diverged"
    assert [record.figures.status for record in report.final_outputs] == ["pass", "fail"]
    assert report.first_divergence.torch_module == "c"


def test_live_export_of_a_model_in_parity(fixture_case, tmp_path):
    model, inputs, _ = fixture_case("tiny_mlp")
    saved = tmp_path / "kept.onnx"
    report = bisect_onnx.bisect(model, inputs, export=bisect_onnx.ExportOptions(save_to=saved))
    assert report.verdict == "parity"
    assert report.environment["exporter"] == "dynamo"
    assert saved.is_file()
    # The kept export is the one that was compared: comparing it again agrees.
    again = bisect_onnx.bisect(model, inputs, onnx_model=saved)
    assert [r.onnx_value for r in again.comparisons] == [r.onnx_value for r in report.comparisons]


def test_training_mode_is_warned_and_left_alone(fixture_case):
    model, inputs, exported = fixture_case("resnet_like")
    model.train()
    try:
        report = bisect_onnx.bisect(model, inputs, onnx_model=exported)
        assert model.training, "bisect-onnx must not change the model's mode"
    finally:
        model.eval()
    assert any("training mode" in warning and "bn1" in warning for warning in report.warnings)
    assert report.verdict == "diverged"  # batch statistics differ from running statistics


def _without_metadata(exported, folder):
    """A copy of the export with every node's metadata stripped (names kept)."""
    import onnx

    proto = onnx.load(str(exported))
    for node in proto.graph.node:
        del node.metadata_props[:]
    onnx.save(proto, str(folder / "stripped.onnx"))
    return folder / "stripped.onnx"


def test_graph_without_metadata_says_so_loudly(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_mlp")
    report = bisect_onnx.bisect(model, inputs, onnx_model=_without_metadata(exported, tmp_path),
                                search=MODULE_ROWS)
    assert report.verdict == "parity"
    assert report.coverage.aligned_modules == 0
    assert report.comparisons == []
    assert "FINAL OUTPUTS ONLY" in report.summary()
    assert any("neither torch exporter metadata" in warning for warning in report.warnings)


def test_graph_without_metadata_is_matched_by_structure_at_op_level(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_mlp")
    report = bisect_onnx.bisect(model, inputs, onnx_model=_without_metadata(exported, tmp_path),
                                search=OP_ROWS)
    assert report.verdict == "parity"
    assert report.coverage.granularity == "op"
    assert report.comparisons and all(record.match.matched_by for record in report.comparisons)
    # Names were kept here, so each match can be checked: the value of the op's name.
    assert all(record.onnx_value == record.fx_node for record in report.comparisons)
    assert any("matched by structure" in warning for warning in report.warnings)


def test_json_follows_schema_2(fixture_case):
    data = json.loads(to_json(run(fixture_case, "avgpool_divisor")))
    assert data["schema"] == 2
    assert data["verdict"] == "diverged"
    assert set(data["environment"]) >= {"bisect_onnx", "torch", "onnx", "onnxruntime", "python",
                                        "platform", "provider", "opt_level", "exporter", "opset"}
    assert set(data["coverage"]) == {"onnx_values", "aligned_values", "torch_modules",
                                     "aligned_modules", "onnx_nodes", "attributed_nodes",
                                     "granularity", "torch_ops", "compared_ops", "fused_ops",
                                     "fx_named_values", "fx_named_compared", "op_scope",
                                     "inferred_nodes"}
    assert data["coverage"]["attributed_nodes"] == data["coverage"]["onnx_nodes"] == 5
    record_keys = {"index", "onnx_node", "onnx_op", "onnx_value", "torch_module", "torch_op",
                   "source", "shape", "dtype", "max_abs_error", "max_rel_error",
                   "mismatch_fraction", "min_passing_atol", "nan_mismatch", "status",
                   "introduced_here"}
    for record in data["comparisons"] + data["final_outputs"] + [data["first_divergence"]]:
        assert record_keys <= set(record)
    # Only failing values are checked on PyTorch's inputs; the pool introduced its error.
    assert data["first_divergence"]["introduced_here"] is True
    # The answer is one record, with its node in the graph; nothing said twice.
    assert data["culprit"]["onnx_value"] == data["first_divergence"]["onnx_value"]
    assert data["culprit"]["node"]["op_type"] == "AveragePool"
    assert "first_culprit" not in data and "inside_op" not in data
    assert "first_culprit" not in data["attribution"]
    assert all(record["introduced_here"] is None for record in data["comparisons"]
               if record["status"] == "pass")
    assert data["first_divergence"]["torch_module"] == "pool"
    assert set(data["first_divergence"]["source"]) == {"file", "line", "call_site"}


def test_divergence_masked_before_the_output_is_hidden_not_a_verdict(fixture_case, tmp_path):
    import onnx
    from onnx import numpy_helper

    model, inputs, exported = fixture_case("tiny_mlp")
    with torch.no_grad():
        pre_activation = model.fc1(torch.from_numpy(inputs["x"]))
    # A unit the ReLU zeroes for every sample: shifting its bias further down changes
    # fc1's output but not the ReLU's, so the final output cannot see it.
    dead = int(torch.nonzero(pre_activation.max(dim=0).values < 0)[0])
    proto = onnx.load(str(exported))
    gemm = next(node for node in proto.graph.node if node.op_type == "Gemm")
    bias = next(init for init in proto.graph.initializer if init.name == gemm.input[2])
    shifted = numpy_helper.to_array(bias).copy()
    shifted[dead] -= 1.0
    bias.CopyFrom(numpy_helper.from_array(shifted, bias.name))
    onnx.save(proto, str(tmp_path / "masked.onnx"))

    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "masked.onnx",
                                runtime=ALL_VALUES)  # fc1's output, before the fused ReLU
    assert report.verdict == "parity"
    assert report.first_divergence is None
    assert [record.torch_module for record in report.hidden_divergences] == ["fc1"]
    assert "hidden" in report.summary()
    # A hidden divergence has a culprit too: the shifted bias's Gemm, classified as for a
    # divergence. It reads only PyTorch's values (one node, nothing finer for op level to
    # name), so fc1's call is rerun in float64 for it rather than the model traced again.
    assert report.culprit.torch_module == "fc1"
    assert report.culprit.local.introduced_here is True
    assert report.coverage.granularity == "module"
    assert report.culprit.onnx_node == gemm.name
    assert report.culprit.local.classification == "graph semantics"
    assert "introduced at ONNX node" in report.summary()


def test_a_failed_run_leaves_no_hooks_on_the_model(fixture_case):
    model, inputs, exported = fixture_case("tiny_mlp")
    with pytest.raises(bisect_onnx.InputError, match="not numeric"):
        bisect_onnx.bisect(model, [inputs["x"], "not an array"], onnx_model=exported)
    assert all(not module._forward_hooks for module in model.modules())


@pytest.mark.parametrize("samples", [0, -2])
def test_sample_count_must_be_positive(fixture_case, samples):
    model, _, exported = fixture_case("tiny_mlp")
    with pytest.raises(bisect_onnx.UsageError, match="samples"):
        bisect_onnx.bisect(model, onnx_model=exported,
                           inputs=bisect_onnx.RandomInputs(samples=samples))


ODD_OUTPUTS = """
import torch
class Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
    def forward(self, x):
        y = self.fc(x)
        return {"logits": y, "pair": (y.argmax(-1), y > 0), "total": y.sum()}
def make():
    torch.manual_seed(0)
    return Odd().eval()
"""


@pytest.mark.parametrize("rows", [2, 0], ids=["batch", "empty"])
def test_dict_nested_integer_boolean_and_scalar_outputs(tmp_path, rows):
    from bisect_onnx.sources.loading import load_model

    (tmp_path / "odd.py").write_text(ODD_OUTPUTS)
    model = load_model(f"{tmp_path}/odd.py:make")
    x = np.random.RandomState(0).randn(rows, 4).astype(np.float32)
    report = bisect_onnx.bisect(model, x)
    assert report.verdict == "parity"
    assert [record.dtype for record in report.final_outputs] == [
        "float32", "int64", "bool", "float32"]
    assert report.final_outputs[3].shape == []


def test_random_samples_share_one_promoted_session(fixture_case):
    model, _, exported = fixture_case("token_classifier")
    seen = []
    with bisect_onnx.events.listening(seen.append):
        report = bisect_onnx.bisect(model, onnx_model=exported,
                                    inputs=bisect_onnx.RandomInputs(samples=3))
    assert report.verdict == "parity"
    # One production session (its optimized graph says what to capture) and one capture
    # session, for all three samples.
    assert [event.kind for event in seen].count("session_created") == 2
    assert [event.detail for event in seen].count("pytorch") == 3  # one capture per sample
