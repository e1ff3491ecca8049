"""A TorchScript GroupNorm is paired as one op, so a planted epsilon is named at its node.

TorchScript writes ``aten::group_norm`` as Reshape, InstanceNormalization, Reshape, Mul,
Add. Left out of the pairing table, the five nodes were named as a segment; paired
with the Add, the op is looked inside and its InstanceNormalization named.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import export_torchscript_at_parity, plant
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.head = nn.Linear(6, 6), nn.GroupNorm(2, 4), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.fc(x))))


def _epsilon(model: onnx.ModelProto) -> onnx.NodeProto:
    node = next(node for node in model.graph.node if node.op_type == "InstanceNormalization")
    for attribute in node.attribute:
        if attribute.name == "epsilon":
            attribute.f = 0.1
    return node


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # GroupNorm's size check
def test_a_group_norms_planted_epsilon_is_named_at_its_instance_norm(tmp_path):
    torch.manual_seed(0)
    model, x = _Normed().eval(), torch.randn(2, 4, 6)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    node, _ = plant(clean, planted, _epsilon)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
