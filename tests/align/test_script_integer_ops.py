"""Rounding, casts and remainders are paired with their own node (TorchScript export).

Left unpaired, their nodes fell into the segment of the op that read them (an
``aten::mul`` of one Mul node held Floor, Cast, Mod, Cast and Mul), which then stood
for the whole segment as one op: an attribute planted in the Mod was blamed on the Mul
(corpus seed 1013).
"""

from __future__ import annotations

import importlib.util

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import plant
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

OPENVINO = pytest.param("openvino", marks=pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="openvino is not importable here"))


class _Integers(nn.Module):
    def forward(self, x):
        steps = torch.remainder(torch.floor(x * 4).to(torch.int64), 3)
        return x * steps.to(x.dtype) + x


def _fmod(model: onnx.ModelProto) -> onnx.NodeProto:
    """The Mod computes C's fmod (the sign of the dividend) instead of Python's."""
    node = next(node for node in model.graph.node if node.op_type == "Mod")
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("fmod", 1))
    return node


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize("runtime", ["onnxruntime", OPENVINO])
def test_an_attribute_planted_in_an_integer_remainder_is_blamed_on_its_node(tmp_path,
                                                                            runtime):
    model, x = _Integers().eval(), torch.randn(2, 8, 16)  # negatives: fmod differs
    clean, planted = tmp_path / "clean.onnx", tmp_path / "planted.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=False, opset_version=18)
    node, _ = plant(clean, planted, _fmod)
    options = (bisect_onnx.RuntimeOptions(runtime="openvino", precision="f32")
               if runtime == "openvino" else None)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted, runtime=options)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()

