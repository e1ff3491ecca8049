"""TorchScript files of stages held in nested ModuleLists (PVT, GLPN, SegFormer).

``self.block = ModuleList(ModuleList(Layer() ...) for each stage)``: the lists are
iterated, never called, so a trace's module hierarchy leaves them out and the first
layer of every stage reads ``0(Layer)``. Its ops were all put in the first stage's
layer (``block.0.0``): the second stage's ops went unpaired, and a weight planted in
its Linear was named as a segment of two nodes, not at the MatMul.
"""

from __future__ import annotations

import onnx
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from tests.planting import export_torchscript_at_parity, plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED


class _Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


class _Stages(nn.Module):
    """Two stages of two layers, each stage's layers a ModuleList inside a ModuleList."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.block = nn.ModuleList(nn.ModuleList(_Layer(width) for _ in range(2))
                                   for _ in range(2))

    def forward(self, x):
        for stage in self.block:
            for layer in stage:
                x = layer(x)
            x = x * 0.5
        return x


def test_each_stage_s_ops_are_put_in_that_stage_s_layer():
    torch.manual_seed(0)
    model, x = _Stages().eval(), torch.randn(2, 5, 8)
    capture = capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])

    linear_modules = [op.module for op in capture.ops if op.kind == "aten::linear"]

    assert linear_modules == ["block.0.0.fc", "block.0.1.fc", "block.1.0.fc", "block.1.1.fc"]


def test_a_weight_planted_in_the_second_stage_is_named_at_its_matmul(tmp_path):
    torch.manual_seed(0)
    model, x = _Stages().eval(), torch.randn(2, 5, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    matmul = next(node for node in onnx.load(str(clean)).graph.node
                  if node.name == "/block.1.0/fc/MatMul")
    weight_index = 1
    plant(clean, planted, scale_initializer_input(matmul.name, weight_index, 1.05))

    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted,
                                search=bisect_onnx.SearchOptions(granularity="op"))

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == "/block.1.0/fc/MatMul", report.summary()
    assert report.culprit.torch_module == "block.1.0.fc", report.summary()
