"""At parity, intermediates out of tolerance by rounding alone are no hidden divergence.

A deep network's values grow; near zero, an element-wise tolerance of 1e-5 is below
the rounding that builds up over its layers. A clean ResNet-50 export (random weights)
claimed 41 hidden divergences, each of whose nodes, rerun on PyTorch's inputs, agrees.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

import bisect_onnx


class _Deep(nn.Module):
    """Eight convolutions whose values grow sixfold each: rounding builds up past 1e-5."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Conv2d(32, 32, 3, padding=1) for _ in range(8))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) * 6.0
        return x.mean((2, 3))


def test_rounding_that_builds_up_is_said_so_not_claimed_hidden():
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((1, 32, 16, 16)).astype(np.float32) * 4

    report = bisect_onnx.bisect(_Deep().eval(), [x])

    failing = [record for record in report.comparisons if record.failed]
    assert report.verdict == "parity" and failing, report.summary()
    assert report.hidden_divergences == [] and report.culprit is None
    assert [record.onnx_value for record in report.rounding_buildup] == [
        record.onnx_value for record in failing]
    assert report.attribution is not None and report.attribution.drift
    assert "by float rounding that builds up" in report.summary()
    assert "hidden" not in report.summary()
    data = json.loads(json.dumps(report.to_dict(), default=str))
    assert data["hidden_divergences"] == [] and len(data["rounding_buildup"]) == len(failing)
