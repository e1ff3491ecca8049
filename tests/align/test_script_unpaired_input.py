"""An op whose input op has no ONNX value does not stand for that op's nodes.

In a TorchScript export nothing marks where an op's nodes begin but the values its
inputs were paired with. Where an input op was left unpaired (declined, or not in the
table), the nodes before the op may be that other op's: the segment of a ``mul`` after
a floor division reached back over the division's Div and Floor, so a check of all
three stood for the ``mul`` alone and its Mul was named for an error planted in the
Floor (the class behind corpus seed 1013).
"""

from __future__ import annotations

import importlib.util

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import export_torchscript_at_parity, plant, set_attribute
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

NO_OPENVINO = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                 reason="openvino is not importable here")


class _Steps(nn.Module):
    def forward(self, x):
        # A floor division is declined by the op table (it ends past its Div).
        return x + torch.div(x, 0.3, rounding_mode="floor") * 0.1


class _Expanded(nn.Module):
    def forward(self, x):
        # An unpaired layout op (expand) after it does not mark a beginning either.
        y = x * 0.5
        return y + torch.div(y[:, :1], 0.3, rounding_mode="floor").expand(2, 8, 16) * 0.1


class _Stacked(nn.Module):
    def forward(self, x):
        # The stack reads its inputs through a list.
        y = x * 0.5
        return torch.stack([torch.div(y, 0.3, rounding_mode="floor"), y]) * 2


def _ceil(model: onnx.ModelProto) -> onnx.NodeProto:
    node = next(node for node in model.graph.node if node.op_type == "Floor")
    node.op_type = "Ceil"
    return node


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize(("runtime", "module"), [
    ("onnxruntime", _Steps), pytest.param("openvino", _Steps, marks=NO_OPENVINO),
    ("onnxruntime", _Expanded),
    ("onnxruntime", _Stacked)])
def test_an_error_before_an_unpaired_input_is_not_blamed_on_the_op_after_it(tmp_path,
                                                                             runtime, module):
    model, x = module().eval(), torch.randn(2, 8, 16)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    node, _ = plant(clean, planted, _ceil)
    options = (bisect_onnx.RuntimeOptions(runtime="openvino", precision="f32")
               if runtime == "openvino" else None)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted, runtime=options)
    assert report.diverged, report.summary()
    named = ([report.culprit.onnx_node] if report.culprit is not None
             else report.culprit_segment.nodes)
    assert node in named, report.summary()


class _Attention(nn.Module):
    """Heads by ``view`` and ``permute``: the key's is merged into the attention's own
    Transpose, an unpaired input whose nodes are the attention's."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.bias = nn.Parameter(torch.randn(1, 2, 8, 8))

    def forward(self, x):
        heads = [layer(x).view(2, 8, 2, 8).permute(0, 2, 1, 3)
                 for layer in (self.q, self.k, self.v)]
        out = nn.functional.scaled_dot_product_attention(
            *heads, attn_mask=(self.bias * 0.5).contiguous())
        return out.transpose(1, 2).reshape(2, 8, 16)


@LEGACY_EXPORTER_DEPRECATED
def test_an_attention_after_merged_layout_ops_is_still_looked_inside(tmp_path):
    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(2, 8, 16)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    node, _ = plant(clean, planted, set_attribute("/Softmax", "Softmax", "axis", 2))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
