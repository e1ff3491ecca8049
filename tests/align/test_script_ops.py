"""TorchScript exports at op level: the planted node itself, not its module's last node.

At module level a planted MatMul weight in a Linear shows at the Linear's ``Add``, a
Softmax axis inside ``nn.MultiheadAttention`` at the attention's last ``Reshape``. At
op level the traced graph's ATen ops are paired with the exporter's nodes by scope, op
and order, and a multi-node op is exported alone to name the node inside it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import bisect_onnx
from bisect_onnx.align.script_ops import align_script_ops
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from fixtures.registry import FIXTURES, repo_path
from tests.planting import (
    export_torchscript_at_parity,
    plant,
    scale_initializer_input,
    set_attribute,
)
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

OP_ROWS = bisect_onnx.SearchOptions(granularity="op")


def _gelu_divisor_scaled(factor: float):
    """Scale the divisor of the one erf GELU's Div (a Constant's output in these files)."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        erf_inputs = {node.input[0] for node in model.graph.node if node.op_type == "Erf"}
        div = next(node for node in model.graph.node
                   if node.op_type == "Div" and node.output[0] in erf_inputs)
        constant = next(node for node in model.graph.node if div.input[1] in node.output)
        array = numpy_helper.to_array(next(a.t for a in constant.attribute if a.name == "value"))
        model.graph.initializer.append(numpy_helper.from_array(
            (array * factor).astype(array.dtype), "planted_divisor"))
        div.input[1] = "planted_divisor"
        return div

    return edit


PLANTS = {
    # plant: (fixture, edit, the module-level culprit before op level)
    "matmul-weight": ("functional_attention", scale_initializer_input("/fc1/MatMul", 1, 1.05)),
    "gemm-weight": ("functional_attention", scale_initializer_input("/attn/Gemm", 1, 1.05)),
    "conv-weight": ("resnet_like", scale_initializer_input("/layer2/conv1/Conv", 1, 1.01)),
    "gelu": ("functional_attention", _gelu_divisor_scaled(1.05)),
    "softmax-axis": ("functional_attention",
                     set_attribute("/attn/Softmax", "Softmax", "axis", 2)),
    "layernorm-weight": ("functional_attention",
                         scale_initializer_input("/norm/LayerNormalization", 1, 1.05)),
    "q-matmul-second-block": ("tiny_transformer",
                              scale_initializer_input("/blocks.1/attn/q/MatMul", 1, 1.05)),
}


@pytest.mark.parametrize("plant_name", PLANTS)
def test_planted_node_of_a_torchscript_export_is_named_exactly(fixture_case, tmp_path,
                                                               plant_name):
    name, edit = PLANTS[plant_name]
    model, inputs, _ = fixture_case(name)
    planted = tmp_path / "planted.onnx"
    node_name, _ = plant(repo_path(FIXTURES[name].torchscript_onnx_file), planted, edit)

    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)

    assert report.final_outputs[0].failed, "the plant must change the output"
    assert report.environment["exporter"] == "torchscript"
    assert report.coverage.granularity == "op"
    assert report.culprit.onnx_node == node_name, (report.culprit, report.inside_op)
    # Nothing before the first divergence failed: no false alarm upstream.
    assert not any(record.failed for record in report.comparisons[:report.first_divergence.index])


@pytest.mark.parametrize("plant_name", ["matmul-weight", "gelu", "softmax-axis"])
def test_inside_a_multi_node_op_the_node_is_found_by_its_fresh_translation(
        fixture_case, tmp_path, plant_name):
    name, edit = PLANTS[plant_name]
    model, inputs, _ = fixture_case(name)
    planted = tmp_path / "planted.onnx"
    node_name, _ = plant(repo_path(FIXTURES[name].torchscript_onnx_file), planted, edit)

    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)

    inside = report.inside_op
    assert inside.node == node_name and node_name in inside.nodes, inside
    assert len(inside.nodes) > 1  # the op is several nodes; its last is not the one
    assert inside.nodes[-1] != node_name


@pytest.mark.parametrize("name", ["tiny_mlp", "resnet_like", "tiny_transformer",
                                  "inplace_relu", "two_inputs", "reused_block", "dropout_mlp",
                                  "functional_attention", "token_classifier"])
def test_faithful_torchscript_export_at_op_level_raises_no_false_alarm(fixture_case, name):
    model, inputs, _ = fixture_case(name)
    report = bisect_onnx.bisect(model, inputs, search=OP_ROWS,
                                onnx_model=repo_path(FIXTURES[name].torchscript_onnx_file))
    assert report.coverage.granularity == "op"
    assert report.verdict == "parity" and report.hidden_divergences == []
    assert report.coverage.compared_ops > 0


def test_every_pair_holds_the_same_tensor_on_a_faithful_export(fixture_case):
    """With every value promoted, each paired ONNX value equals its op's torch value."""
    model, inputs, _ = fixture_case("tiny_transformer")
    arrays = list(inputs.values())
    side = OnnxRuntimeRunner(repo_path(FIXTURES["tiny_transformer"].torchscript_onnx_file),
                           promote="all")
    capture = capture_script_ops(trace_script(model, arrays), arrays)
    alignment = align_script_ops(capture, side.nodes, side.run(arrays).capture.values, side.model)

    assert len(alignment.pairs) >= 30
    for pair in alignment.pairs:
        np.testing.assert_allclose(pair.candidate.array, pair.reference.array, atol=1e-5,
                                   err_msg=pair.reference.name)
    # k.transpose(1, 2).transpose(-2, -1) is one merged Transpose in the file: with a
    # square (seq, head) shape it would pass for either op by shape; neither is paired.
    merged = {item.name for item in alignment.torch_only if item.kind == "folded"}
    assert {"transpose_1", "transpose_3"} <= merged


def test_op_records_carry_the_traced_op_module_and_source_line(fixture_case, tmp_path):
    name, edit = PLANTS["gelu"]
    model, inputs, _ = fixture_case(name)
    planted = tmp_path / "planted.onnx"
    plant(repo_path(FIXTURES[name].torchscript_onnx_file), planted, edit)

    culprit = bisect_onnx.bisect(model, inputs, onnx_model=planted).culprit

    assert culprit.torch_op == "aten.gelu" and culprit.fx_node == "gelu"
    assert culprit.torch_module == ""  # F.gelu in the model's own forward
    assert culprit.source.file.endswith("fixtures/models.py")
    line = repo_path("fixtures/models.py").read_text().splitlines()[culprit.source.line - 1]
    assert "gelu" in line


def test_batchnorm_folded_into_its_conv_is_compared_as_the_batchnorm(fixture_case):
    model, inputs, _ = fixture_case("resnet_like")
    report = bisect_onnx.bisect(model, inputs, search=OP_ROWS,
                                onnx_model=repo_path(FIXTURES["resnet_like"]
                                                     .torchscript_onnx_file),
                                runtime=bisect_onnx.RuntimeOptions(promote="all"))
    by_node = {record.onnx_node: record for record in report.comparisons}
    assert by_node["/layer1/conv1/Conv"].torch_op == "aten.batch_norm"
    fused = [item for item in report.unaligned if item.kind == "fused"]
    assert fused and all("/Conv" in item.reason for item in fused)


def test_each_call_of_a_reused_module_is_named_apart(fixture_case):
    # resnet_like's blocks call one ReLU twice: the second call is relu@1, as dynamo's are.
    model, inputs, _ = fixture_case("resnet_like")
    report = bisect_onnx.bisect(model, inputs,
                                onnx_model=repo_path(FIXTURES["resnet_like"].torchscript_onnx_file),
                                search=OP_ROWS)
    modules = [row.torch_module for row in report.comparisons
               if row.torch_module and row.torch_module.startswith("layer1.relu")]
    assert modules == ["layer1.relu", "layer1.relu@1"]


class _SelfAttention(torch.nn.Module):
    """One-head ``nn.MultiheadAttention`` without weights: the trace goes through SDPA, ONNX
    Runtime fuses the reshapes between (shapes unknown), and q's view has the output's shape."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(16, 1, batch_first=True)

    def forward(self, x):
        x = torch.nn.functional.pad(x, (0, 0, 1, 0))  # pads shape inference cannot follow
        return x + self.attention(x, x, x, need_weights=False)[0]


@LEGACY_EXPORTER_DEPRECATED
def test_an_op_is_not_paired_past_a_node_of_unknown_shape(tmp_path):
    """The first ``view`` is not paired with the attention's last Reshape (same shape):
    each op takes the next node of its type in order, a node of unknown shape too."""
    torch.manual_seed(0)
    model, x = _SelfAttention().eval(), torch.randn(2, 8, 16)
    clean, _ = export_torchscript_at_parity(model, x, tmp_path)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=clean, search=OP_ROWS)
    assert report.verdict == "parity" and report.hidden_divergences == [], report.summary()
    paired = {row.fx_node: row.onnx_node for row in report.comparisons}
    last_reshape = [node.name for node in onnx.load(str(clean)).graph.node
                    if node.op_type == "Reshape"][-1]
    assert paired.get("view") != last_reshape
    assert paired.get("view_6") == last_reshape


class _BiasedAttention(torch.nn.Module):
    """SDPA with a mask computed from a weight alone (Swin's relative position bias)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(15, 2))
        self.register_buffer("index", torch.randint(0, 15, (8, 8)))

    def forward(self, x):
        q = x.view(2, 8, 2, 4).transpose(1, 2)
        bias = self.table[self.index].permute(2, 0, 1).unsqueeze(0)  # weights alone
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bias)
        return out.transpose(1, 2).reshape(2, 8, 8)


@LEGACY_EXPORTER_DEPRECATED
def test_inside_sdpa_with_a_mask_made_from_weights_the_softmax_is_named(tmp_path):
    """The mask is no op value but the same on any input: SDPA is exported alone with it
    as a weight, and its Softmax found wrong inside. Named at SDPA's last MatMul before."""
    torch.manual_seed(0)
    model, x = _BiasedAttention().eval(), torch.randn(2, 8, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    softmax = next(node for node in onnx.load(str(clean)).graph.node
                   if node.op_type == "Softmax")
    node, _ = plant(clean, planted, set_attribute(softmax.name, "Softmax", "axis", 1))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.fx_node == "scaled_dot_product_attention"
