"""A node whose input the reference has no value of is run with the nodes that make it.

TorchScript writes a hand-made RMS norm's ``rsqrt`` as Sqrt and Div: PyTorch holds the
Div's value but not the Sqrt's, and ONNX Runtime fuses the whole norm into one kernel.
The nodes of the failing segment each rerun on PyTorch's values, the Div with the Sqrt
before it: the planted weight's Mul is named, not the seven-node segment (as before).
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import export_torchscript_at_parity, plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _RmsNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


@LEGACY_EXPORTER_DEPRECATED
def test_the_weights_mul_of_a_fused_rms_norm_is_named(tmp_path):
    torch.manual_seed(0)
    model, x = _RmsNorm().eval(), torch.randn(2, 8, 16)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    last_mul = [node for node in onnx.load(str(clean)).graph.node
                if node.op_type == "Mul"][-1]
    node, _ = plant(clean, planted, scale_initializer_input(last_mul.name, 1, 1.05))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    narrowed = report.attribution.narrowed
    divide = next(name for name in narrowed["segment"] if name.endswith("/Div"))
    sqrt = next(name for name in narrowed["segment"] if name.endswith("/Sqrt"))
    # The Div runs with the Sqrt before it: alone where the exporter's record pairs
    # rsqrt with the Div (PyTorch holds its value), with the Mul after it where the
    # hand table, which knew rsqrt as a Reciprocal, left it unpaired.
    runs_with_sqrt = [name for name, together in narrowed["run_with"].items()
                      if sqrt in together and divide in (name, *together)]
    assert runs_with_sqrt and all(error == pytest.approx(0.0, abs=1e-6)
                                  for name, error in narrowed["alone"].items() if name != node)
