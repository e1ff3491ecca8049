"""A node is never blamed as "no ONNX node" where the failing check's own nodes compute it.

A Conv the exporter fused with the BatchNorm after it is paired with the norm's value;
a module's call wrapping a child (a LayerNorm in a block) hands the child's value on; a
module called twice has the same value on both calls' scopes. In each, a module call
whose input ONNX's value equals is computed by the failing check's own nodes, so the
planted node, not a "computation the graph has no node for", is the culprit.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import bisect_onnx
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.search.nodeless import modules_computing
from tests.planting import plant, scale_initializer_input
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED

EXPORTERS = ("dynamo", "torchscript")


class _ConvNorm(nn.Module):
    """Conv then BatchNorm (eval) on an unsqueezed input: both exporters fold the norm
    into the Conv, whose value is then paired with the norm's."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(2)
        with torch.no_grad():
            self.norm.running_mean.copy_(torch.tensor([0.3, -0.2]))
            self.norm.running_var.copy_(torch.tensor([0.5, 2.0]))

    def forward(self, x):
        y = self.norm(self.conv(x.unsqueeze(1)))
        return y.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], 16)


class _Elu(nn.Module):
    def forward(self, x):
        return F.elu(x)


class _Norm(nn.Module):
    """A block wrapping its LayerNorm: the block's value is the norm's."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x)


class _Again(nn.Module):
    """An earlier block's module called again (one module object, two parents)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.reused = module

    def forward(self, x):
        return self.reused(x)


class _Blocks(nn.Module):
    def __init__(self, *blocks: nn.Module):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _folded() -> nn.Module:
    return _Blocks(nn.Linear(8, 8), _ConvNorm(), nn.Linear(16, 4))


def _reused() -> nn.Module:
    act = _Elu()
    return _Blocks(nn.Linear(8, 8), act, _Again(act), _Norm(), nn.Linear(8, 4))


def _export(model: nn.Module, x: torch.Tensor, exporter: str, path) -> None:
    torch.onnx.export(model, (x,), str(path), dynamo=exporter == "dynamo", opset_version=18)


def _set(op_type: str, occurrence: int, name: str, value: float):
    """Set attribute ``name`` of the ``occurrence``-th ``op_type`` node (graph order)."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = [node for node in model.graph.node if node.op_type == op_type][occurrence]
        kept = [attr for attr in node.attribute if attr.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, onnx.helper.make_attribute(name, value)])
        return node

    return edit


def _conv_weight(model: onnx.ModelProto) -> onnx.NodeProto:
    node = next(node for node in model.graph.node if node.op_type == "Conv")
    return scale_initializer_input(node.name, 2, 1.05)(model)


@LEGACY_EXPORTER_DEPRECATED
@DYNAMO_LEAFSPEC_DEPRECATED
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(("make", "edit"), [
    (_folded, _conv_weight),                              # Conv paired with the norm's value
    (_reused, _set("Elu", 1, "alpha", 2.0)),              # the reused module's second call
    (_reused, _set("LayerNormalization", 0, "epsilon", 0.1)),  # inside a wrapping block
], ids=["conv-folded-norm", "reused-call", "wrapped-norm"])
def test_the_planted_node_is_named_not_a_module_with_no_node(tmp_path, exporter, make, edit):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 8, 8)
    clean, planted = tmp_path / "clean.onnx", tmp_path / "planted.onnx"
    _export(model, x, exporter, clean)
    node, _ = plant(clean, planted, edit)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.diverged, report.summary()
    assert (report.attribution is None or report.attribution.nodeless is None), report.summary()
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()


def test_the_modules_a_check_computes_in_are_read_off_its_scopes():
    # An inserted node has no scope: it may compute anything, so nothing is known.
    nodes = [NodeInfo(0, "/blocks.2/norm/LayerNormalization", "LayerNormalization", ("a",),
                      None), NodeInfo(1, "inserted_mul", "Mul", ("b",), None)]
    values = dict.fromkeys(["blocks.2", "blocks.2 (input)", "blocks.2.norm"])
    assert modules_computing(["/blocks.2/norm/LayerNormalization"], nodes, values,
                             {}) == {"blocks.2", "blocks.2.norm"}
    assert modules_computing([node.name for node in nodes], nodes, values, {}) is None
