"""Op-level alignment on real exports: every ATen op against the ONNX value it became."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.pipeline.prepare import names_the_values
from bisect_onnx.pipeline.torch_comparison import NO_OP_LEVEL
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from fixtures.architectures import ARCHITECTURES
from fixtures.registry import FIXTURES, repo_path
from tests.planting import fx_segment, plant, scale_initializer_input, set_attribute
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED, TORCH_JIT_DEPRECATED

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")
OP_ROWS = bisect_onnx.SearchOptions(granularity="op")


def _passes_before(report: bisect_onnx.Report) -> None:
    first = report.first_divergence
    assert first is not None
    assert all(not record.failed for record in report.comparisons[: first.index])


ALL_VALUES = bisect_onnx.RuntimeOptions(promote="all")  # what the exporter made, unfused


def test_resnet_like_every_node_attributed_and_folded_conv_listed_as_fused(fixture_case):
    model, inputs, exported = fixture_case("resnet_like")
    # Asked for: at parity a file exported elsewhere is compared module by module.
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported, runtime=ALL_VALUES,
                                search=OP_ROWS)
    coverage = report.coverage
    assert report.verdict == "parity"
    assert coverage.granularity == "op"
    assert coverage.attributed_nodes == coverage.onnx_nodes
    assert coverage.fx_named_compared == coverage.fx_named_values > 0
    fused = {item.name: item.reason for item in report.unaligned if item.kind == "fused"}
    # The first Conv's own FX node has no value: it was folded with the BatchNorm after it.
    assert "conv2d" in fused and "FuseBatchNormIntoConv" in fused["conv2d"]
    assert coverage.fused_ops == len(fused)
    batch_norm = next(record for record in report.comparisons
                      if record.torch_module == "bn1")
    assert batch_norm.onnx_op == "Conv"
    assert batch_norm.torch_op == "aten._native_batch_norm_legit_no_training.default"
    assert batch_norm.source is not None and batch_norm.source.file.endswith("models.py")


def test_transformer_lists_each_value_without_a_counterpart_with_its_reason(fixture_case):
    model, inputs, exported = fixture_case("tiny_transformer")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported, runtime=ALL_VALUES,
                                search=OP_ROWS)
    proto = onnx.load(str(exported), load_external_data=False)
    matmul = fx_segment(proto, "linear")[0]
    assert matmul.op_type == "MatMul"
    reasons = {item.name: item for item in report.onnx_unaligned}
    intermediate = reasons[matmul.output[0]]
    assert intermediate.kind == "intermediate"
    assert "aten.linear" in intermediate.reason and "compared at its output linear" in \
        intermediate.reason
    removed = {item.name: item.reason for item in report.unaligned if item.kind == "removed"}
    assert "softmax" in removed["clone"]
    # Every float ONNX value is either compared or explained.
    compared = {record.onnx_value for record in report.comparisons}
    explained = set(reasons)
    candidate = OnnxRuntimeRunner(exported, promote="all").run(list(inputs.values())).capture
    assert set(candidate.values) == compared | explained
    assert not compared & explained


def _planted_fc1(exported, folder):
    """blocks.0.mlp.fc1's MatMul weight scaled just past the tolerance: (file, MatMul, Add)."""
    matmul, add = fx_segment(onnx.load(str(exported), load_external_data=False), "linear_4")
    planted = folder / "planted.onnx"
    plant(exported, planted, scale_initializer_input(matmul.name, 1, 1.003))
    return planted, matmul, add


def test_planted_matmul_is_reported_at_the_matmul_not_the_bias_add(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_transformer")
    planted, matmul, add = _planted_fc1(exported, tmp_path)
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    first = report.first_divergence
    assert report.verdict == "diverged"
    assert (first.onnx_node, first.onnx_op) == (matmul.name, "MatMul")
    assert first.onnx_value == add.output[0] == "linear_4"
    assert first.torch_op == "aten.linear.default"
    assert first.torch_module == "blocks.0.mlp.fc1"
    assert first.source.file.endswith("fixtures/models.py")
    assert report.inside_op.node == matmul.name
    assert report.inside_op.value == matmul.output[0]
    _passes_before(report)
    assert "the first of the 2 nodes of its op" in report.summary()


def test_module_granularity_rows_say_which_op_failed_first(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_transformer")
    planted, _, _ = _planted_fc1(exported, tmp_path)
    op_level = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted, search=MODULE_ROWS)
    assert report.coverage.granularity == "module"
    assert {record.torch_module for record in report.comparisons} >= {"blocks.0.mlp.fc1",
                                                                     "blocks.0.mlp"}
    assert report.first_divergence.torch_module == "blocks.0.mlp.fc1"
    assert op_level.first_divergence.fx_node == "linear_4"


def test_module_rows_aggregate_ops_when_the_export_is_made_here(fixture_case):
    model, inputs, _ = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, search=MODULE_ROWS)
    first = report.first_divergence
    assert first.torch_module == "pool"
    assert (first.match.ops_compared, first.match.ops_failed, first.match.first_failing_op) == (
        1, 1, "avg_pool2d")
    assert "first failing op inside: aten.avg_pool2d (avg_pool2d)" in report.summary()
    assert "ops failed" in report.table()
    passing = next(record for record in report.comparisons if record.torch_module == "relu")
    assert (passing.match.ops_failed, passing.match.first_failing_op) == (0, None)


def test_gelu_called_as_a_function_is_reported_at_its_node(tmp_path):
    architecture = ARCHITECTURES["gpt2"]
    model, inputs = architecture.factory("small"), architecture.make_inputs("small")
    exported = tmp_path / "gpt2.onnx"
    report = bisect_onnx.bisect(model, inputs, export=bisect_onnx.ExportOptions(
        opset=18, save_to=exported))
    assert report.verdict == "parity"
    proto = onnx.load(str(exported), load_external_data=False)
    constants = {init.name for init in proto.graph.initializer}
    segment = fx_segment(proto, "gelu_1")
    assert len(segment) > 3  # tanh GELU, decomposed
    # The Mul by sqrt(2/pi) inside the second block's GELU.
    target = [node for node in segment if node.op_type == "Mul" and node.input[0] in constants][1]
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(target.name, 0, 1.1))
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    first = report.first_divergence
    assert report.verdict == "diverged"
    assert first.onnx_node == target.name
    assert first.torch_op == "aten.gelu.default"
    assert first.torch_module == "h.1.mlp"  # the GELU has no module of its own
    assert first.fx_node == "gelu_1"
    _passes_before(report)


def test_a_program_of_another_model_does_not_name_the_values(fixture_case):
    _, _, exported = fixture_case("resnet_like")
    mlp, mlp_inputs, _ = fixture_case("tiny_mlp")
    program = torch.export.export(mlp, tuple(torch.from_numpy(a) for a in mlp_inputs.values()))
    assert not names_the_values(program, OnnxRuntimeRunner(exported).nodes)
    assert not names_the_values(None, OnnxRuntimeRunner(exported).nodes)


def test_op_granularity_where_it_cannot_be_had_says_so(fixture_case):
    model, inputs, _ = fixture_case("tiny_mlp")
    torchscript = repo_path(FIXTURES["tiny_mlp"].torchscript_onnx_file)
    # An ExportedProgram is no TorchScript graph, and no FX program of this file.
    program = torch.export.export(model, tuple(torch.from_numpy(a) for a in inputs.values()))
    report = bisect_onnx.bisect(program, inputs, onnx_model=torchscript, search=OP_ROWS)
    assert report.coverage.granularity == "module"
    assert NO_OP_LEVEL in report.warnings
    with pytest.raises(bisect_onnx.UsageError, match="granularity"):
        bisect_onnx.bisect(model, inputs, search=bisect_onnx.SearchOptions(granularity="layer"))


def test_cli_granularity_option(tmp_path, capsys):
    fixture = FIXTURES["avgpool_divisor"]
    args = [fixture.factory, "--input", str(repo_path(fixture.input_file)), "--onnx",
            str(repo_path(fixture.onnx_file)), "-q"]
    assert main([*args, "--granularity", "module", "--json", str(tmp_path / "m.json")]) == 1
    assert main([*args, "--granularity", "op", "--json", str(tmp_path / "o.json")]) == 1
    module = json.loads((tmp_path / "m.json").read_text())
    op = json.loads((tmp_path / "o.json").read_text())
    assert module["coverage"]["granularity"] == "module"
    assert op["coverage"]["granularity"] == "op"
    assert op["first_divergence"]["fx_node"] == "avg_pool2d"
    assert "aten.avg_pool2d (avg_pool2d) in module pool" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([*args, "--granularity", "layer"])
    assert exited.value.code == 2


def _renamed_without_metadata(source, target):
    """The export as another tool might leave it: every value and node renamed, no metadata.

    Returns the map from new value names to the original (FX) names.
    """
    proto = onnx.load(str(source))
    graph = proto.graph
    renamed = {}
    for index, node in enumerate(graph.node):
        del node.metadata_props[:]
        node.name = f"n{index}"
        for position, output in enumerate(node.output):
            renamed[output] = f"t{index}_{position}"
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        node.output[:] = [renamed.get(name, name) for name in node.output]
    for value in [*graph.output, *graph.value_info]:
        value.name = renamed.get(value.name, value.name)
    onnx.save(proto, str(target))
    return {new: old for old, new in renamed.items()}


def test_a_renamed_file_without_metadata_is_matched_by_structure(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_transformer")
    matmul, _ = fx_segment(onnx.load(str(exported), load_external_data=False), "linear_6")
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(matmul.name, 1, 1.01))
    original_names = _renamed_without_metadata(planted, tmp_path / "foreign.onnx")
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "foreign.onnx")
    assert report.coverage.granularity == "op"
    assert report.comparisons and all(record.match.matched_by and record.match.match_confidence > 0
                                      for record in report.comparisons)
    # Every match is right (each value was named after its op before the renaming) and
    # no torch value is matched twice.
    assert all(original_names[record.onnx_value] == record.fx_node
               for record in report.comparisons)
    fx_nodes = [record.fx_node for record in report.comparisons]
    assert len(fx_nodes) == len(set(fx_nodes))
    # Every captured value that was an op's (not a decomposition's val_N) is compared.
    compared = {record.onnx_value for record in report.comparisons}
    captured = compared | {item.name for item in report.onnx_unaligned}
    named = {value for value in captured if not original_names[value].startswith("val_")}
    assert named <= compared
    culprit = report.culprit
    assert culprit.fx_node == "linear_6" and culprit.torch_module == "blocks.1.attn.q"
    assert culprit.local.introduced_here is True
    assert any("matched by structure" in warning for warning in report.warnings)


def test_a_file_exported_elsewhere_is_traced_again_only_when_it_diverges(fixture_case):
    model, inputs, exported = fixture_case("tiny_transformer")
    seen = []
    with bisect_onnx.events.listening(seen.append):
        report = bisect_onnx.bisect(model, inputs, onnx_model=exported)
    assert report.verdict == "parity" and report.coverage.granularity == "module"
    assert "pytorch ops" not in [event.detail for event in seen]


@pytest.mark.parametrize("kind", ["onnx_file", "torchscript_onnx_file"])
@pytest.mark.parametrize("name", ["tiny_transformer", "functional_attention", "resnet_like"])
def test_op_level_compares_every_value_module_level_compares(fixture_case, name, kind):
    model, inputs, _ = fixture_case(name)
    path = repo_path(getattr(FIXTURES[name], kind))
    by = {rows.granularity: bisect_onnx.bisect(model, inputs, onnx_model=path, search=rows)
          for rows in (MODULE_ROWS, OP_ROWS)}
    assert by["op"].coverage.granularity == "op"
    modules = {row.onnx_value for row in by["module"].comparisons}
    ops = {row.onnx_value for row in by["op"].comparisons}
    assert modules <= ops, sorted(modules - ops)


class _OneCall(torch.nn.Module):
    """A module whose forward is one call the TorchScript op pairing does not know."""

    def forward(self, x):
        return torch.cumsum(x, -1)


class _AroundOneCall(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.op, self.fc2 = torch.nn.Linear(8, 8), _OneCall(), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.op(self.fc1(x)))


@LEGACY_EXPORTER_DEPRECATED
@TORCH_JIT_DEPRECATED
def test_an_op_the_pairing_does_not_know_keeps_its_modules_row_and_its_culprit(tmp_path):
    torch.manual_seed(0)
    model, x = _AroundOneCall().eval(), torch.randn(2, 8)
    exported, planted = tmp_path / "model.onnx", tmp_path / "planted.onnx"
    torch.onnx.export(model, (x,), str(exported), dynamo=False)
    node, _ = plant(exported, planted, set_attribute("/op/CumSum", "CumSum", "reverse", 1))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.coverage.granularity == "op"
    assert "op" in {row.torch_module for row in report.comparisons}  # the module's row
    assert report.culprit is not None and report.culprit.onnx_node == node
    assert report.culprit.torch_module == "op"
