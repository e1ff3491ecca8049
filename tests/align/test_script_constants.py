"""TorchScript exports at op level: values no input reaches, computed by the file at run time.

Speech2Text makes its position ids by a ``cumsum`` over a mask of the input's size, and
BiT standardizes each Conv's weight by a ``batch_norm`` over it: the trace computes
both from sizes and weights alone, so no row compares them, but the TorchScript
exporter computes them at run time (a ``CumSum``, a ``BatchNormalization``). A planted
attribute there was named at the node reading the value (the ``Gather`` of the
embedding, the ``Conv``), whose own inputs had never been checked. The nodes that hold
such values are now checked inside the failing segment against PyTorch's.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bisect_onnx
from tests.planting import plant, set_attribute
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED


class _StandardizedConv(nn.Conv2d):
    """BiT's weight-standardized convolution: the weight batch-normalized per channel."""

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                              training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class _Positions(nn.Module):
    """Speech2Text's position ids: a cumulative sum over a mask of the input's size."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(18, 6)

    def forward(self, x):
        mask = torch.ones(x.shape[:2], dtype=torch.int32)
        positions = torch.cumsum(mask, dim=1).type_as(mask) * mask + 1
        return self.table(positions.long())


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = _StandardizedConv(3, 6, 3, padding=1)
        self.positions = _Positions()
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(2).transpose(1, 2)  # [batch, 16 places, 6]
        return self.head(h + self.positions(h))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """The model, its input and its TorchScript export, checked clean at op level."""
    torch.manual_seed(0)
    model, x = _Model().eval(), torch.randn(1, 3, 4, 4)
    path = tmp_path_factory.mktemp("constants") / "clean.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path)
    assert not report.diverged and not report.hidden_divergences, report.summary()
    return model, x.numpy(), path


@pytest.mark.parametrize("op_type, module, attribute, value", [
    ("CumSum", "/positions/CumSum", "reverse", 1),
    ("BatchNormalization", "/conv/BatchNormalization", "epsilon", 0.5),
], ids=["position-ids", "standardized-weight"])
def test_a_plant_in_a_value_no_input_reaches_is_named_at_its_node(export, tmp_path, op_type,
                                                                  module, attribute, value):
    model, x, clean = export
    planted, _ = plant(clean, tmp_path / "planted.onnx",
                       set_attribute(module, op_type, attribute, value))

    report = bisect_onnx.bisect(model, x, onnx_model=tmp_path / "planted.onnx")

    assert report.diverged
    culprit = report.culprit
    assert culprit is not None and culprit.onnx_node == planted, report.summary()
    assert culprit.local.introduced_here


class _Bias(nn.Module):
    """Data2VecVision's relative position bias: a weight laid out, resized, laid out back."""

    dynamic_axes = {"x": {0: "rows"}}

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, 4))

    def forward(self, x):
        grid = self.table.reshape(1, 4, 4, 4).permute(0, 3, 1, 2)  # folded by the exporter
        # Sized from the input's rows, a dynamic axis: inference cannot tell the Resize's
        # size, nor the Transpose's after it, which the folded permute's value would fit.
        grid = F.interpolate(grid, size=(x.shape[0] // 2, 4), mode="bilinear",
                             align_corners=False)
        return x + grid.permute(0, 2, 3, 1).reshape(-1, 4)[:x.shape[0]]


class _Buckets(nn.Module):
    """T5's relative position buckets: arithmetic over positions, part of it folded."""

    dynamic_axes = None

    def __init__(self):
        super().__init__()
        self.bias = nn.Embedding(32, 4)

    def forward(self, x):
        places = torch.arange(x.shape[0])
        relative = places[None, :] - places[:, None]
        buckets = 0
        buckets += (relative > 0).to(torch.long) * 16  # folded into a constant
        relative = torch.abs(relative)
        large = 8 + (torch.log(relative.float() / 8) / math.log(128 / 8) * 8).to(torch.long)
        large = torch.min(large, torch.full_like(large, 15))
        buckets += torch.where(relative < 8, relative, large)
        return x + self.bias(buckets).sum(1)


@pytest.mark.parametrize("module", [_Bias, _Buckets], ids=["resized-bias", "t5-buckets"])
def test_a_value_no_input_reaches_is_paired_only_with_a_node_holding_it(tmp_path, module):
    from bisect_onnx.align.script_ops import align_script_ops
    from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    torch.manual_seed(0)
    model, x = module().eval(), torch.randn(16, 4)
    path = tmp_path / "bias.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], dynamic_axes=module.dynamic_axes)
    side = OnnxRuntimeRunner(path, promote="all")
    every = side.run([x.numpy()]).capture.values
    capture = capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])
    # Captured as the pipeline does: without the file's intermediate values.
    align_script_ops(capture, side.nodes, {}, side.model)

    # The folded permute's value fits the Transpose's inferred shape, (1, ?, 4, 4), but
    # the Transpose holds the resized grid; the folded ``(relative > 0).to(long)`` would
    # take a later Cast: no value may be kept by a node not holding it.
    # The buckets' shapes are known: their Where, Min and Gather hold their ops' values.
    assert capture.constant_references or module is _Bias
    for value, reference in capture.constant_references.items():
        assert reference.array.shape == every[value].array.shape, (value, reference.name)
        np.testing.assert_allclose(reference.array, every[value].array, rtol=1e-5, atol=1e-6)
