"""A node inserted into a graph (no counterpart in the reference) is named as the culprit."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from fixtures.registry import FIXTURES, repo_path
from tests.planting import insert_mul, inserted_after_first, plant
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

CASES = [  # fixture, export, the node the inserted Mul follows
    ("resnet_like", "onnx_file", "node_Conv_146"),  # inside a Conv+ReLU kernel
    ("resnet_like", "onnx_file", "node_add"),
    ("resnet_like", "torchscript_onnx_file", "/layer2/conv1/Conv"),
    ("tiny_mlp", "onnx_file", "node_relu"),
    ("tiny_mlp", "torchscript_onnx_file", "/relu/Relu"),
]


@pytest.mark.parametrize(("name", "kind", "after"), CASES)
@pytest.mark.parametrize("form", ["pytorch", "onnx"])
def test_an_inserted_node_is_the_culprit_not_its_consumer(fixture_case, tmp_path, name, kind,
                                                           after, form):
    model, inputs, _ = fixture_case(name)
    clean, planted = repo_path(getattr(FIXTURES[name], kind)), tmp_path / "inserted.onnx"
    inserted, _ = plant(clean, planted, insert_mul(after, 1.5))
    report = (bisect_onnx.bisect(model, inputs, onnx_model=planted) if form == "pytorch"
              else bisect_onnx.bisect_onnx_models(clean, planted, list(inputs.values())))
    assert report.diverged or report.hidden_divergences
    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == inserted
    # Its consumers only inherit (a kernel's output checked whole holds the culprit).
    kernel = (report.attribution.inside_kernel or {}).get("kernel_output")
    assert not any(row.local.introduced_here for row in report.comparisons
                   if row.onnx_node != inserted and row.onnx_value != kernel)


class _GroupNormHead(nn.Module):
    """A GroupNorm: TorchScript writes Reshape, InstanceNormalization, Reshape, Mul, Add,
    and PyTorch holds no value of any node inside it."""

    def __init__(self):
        super().__init__()
        self.norm, self.head = nn.GroupNorm(2, 4), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.norm(x))


class _TwoLinears(nn.Module):
    """Linears on a 3-D input: TorchScript writes each as MatMul then Add."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


class _NormThenLinear(nn.Module):
    """A BatchNorm on transposed time steps, then a Linear: ONNX Runtime fuses the closing
    Transpose into the Linear's MatMul, so what enters the Linear is never captured."""

    def __init__(self):
        super().__init__()
        self.norm, self.linear = nn.BatchNorm1d(4), nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(self.norm(x).transpose(1, 2))


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # GroupNorm's size check
@pytest.mark.parametrize(("make", "op_type", "fed"), [
    (_GroupNormHead, "InstanceNormalization", "segment"),  # no PyTorch value inside the op
    (_TwoLinears, "MatMul", "segment"),  # between a Linear's MatMul and Add: the op's value
    # is not the MatMul's, though the Mul cut the op's nodes short there
    (_NormThenLinear, "MatMul", "segment"),  # the Mul's output, read by the Linear's Add,
    # is no input of the Linear: it is computed from the Linear's own MatMul
], ids=["inside-group-norm", "inside-linear", "inside-linear-after-transpose"])
def test_a_node_inserted_inside_an_op_is_named(tmp_path, make, op_type, fed):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(2, 4, 6)
    clean, planted = tmp_path / "clean.onnx", tmp_path / "inserted.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=False, opset_version=17)
    after = [node.name for node in onnx.load(str(clean)).graph.node
             if node.op_type == op_type][-1]
    inserted, _ = plant(clean, planted, insert_mul(after, 1.5))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == inserted, report.summary()
    # Its input has no PyTorch value: it was fed as the segment computed it.
    assert report.attribution.unpaired["fed"] == fed
    assert "as the segment computed it" in report.summary()


class _LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * 2.0


@LEGACY_EXPORTER_DEPRECATED
def test_a_node_inserted_between_an_ops_nodes_is_named_not_the_op(tmp_path):
    """After the first of GELU's two Muls: the second reads the inserted node, so GELU's
    value is in neither Mul. Paired with the first, GELU failed and was named."""
    torch.manual_seed(0)
    report, inserted = inserted_after_first(_LinearGelu().eval(), torch.randn(2, 4, 6),
                                            tmp_path, "Mul")
    assert report.culprit is not None and report.culprit.onnx_node == inserted, report.summary()
    assert not any(row.fx_node == "gelu" for row in report.comparisons)
