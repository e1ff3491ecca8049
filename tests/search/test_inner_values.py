"""A call traced alone: its module values name the node inside a fused kernel.

For a dynamo file, op level retraces only the module call holding the culprit; its ops
carry that trace's FX names, not the file's value names. A residual block's second
conv (BatchNorm folded into it, then a residual Add ONNX Runtime fuses with it) was
named as a segment of the Conv and the Add; the module calls' values, paired with the
file's values, name the Conv, under the innermost module that computed it.
"""

from __future__ import annotations

import torch
from torch import nn

import bisect_onnx
from tests.planting import plant, scale_initializer_input
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED


class _ConvLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.convolution, self.normalization = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.normalization(self.convolution(x))


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(_ConvLayer(), nn.ReLU(), _ConvLayer())

    def forward(self, x):
        return torch.relu(self.layer(x) + x)


@DYNAMO_LEAFSPEC_DEPRECATED
def test_a_conv_fused_with_a_residual_add_is_named_in_its_module(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _Residual()).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 8, 8)
    clean = tmp_path / "clean.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=True)
    import onnx

    conv = [node.name for node in onnx.load(str(clean)).graph.node if node.op_type == "Conv"][-1]
    node, _ = plant(clean, tmp_path / "planted.onnx", scale_initializer_input(conv, 1, 1.05))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=tmp_path / "planted.onnx")
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.torch_module.startswith("1.layer.2"), report.culprit.torch_module
