"""TorchScript files of models that make a tensor from another's size (issue 49).

RWKV starts its state as ``torch.zeros_like(key[:, 0]) - 1e38``: the trace fixes
sizes, so the exporter folds that into a constant and drops ``key[:, 0]``, read only
for its size. Looked for like any op, each took the node of the loop's later
``key[:, i]``, and every op of the call after it was paired one node off.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

import bisect_onnx
from bisect_onnx.align.script_ops import align_script_ops
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED


class _Recurrence(nn.Module):
    """A state started from ``zeros_like(key[:, -1])``, stepped over the sequence.

    (With ``key[:, 0]`` the common-subexpression pass merges the select read for its
    size with the first step's, which is data.)
    """

    def __init__(self):
        super().__init__()
        self.key = nn.Linear(8, 8)

    def forward(self, x):
        key = self.key(x)
        state = torch.zeros_like(key[:, -1])
        low = torch.zeros_like(key[:, -1]) - 1e4
        for index in range(key.shape[1]):
            current = key[:, index]
            low = torch.maximum(low, current)
            state = state * 0.5 + current.exp() * (current - low).sigmoid()
        return state


def _aligned(model: nn.Module, x: torch.Tensor, folder):
    """The model's TorchScript export, its traced ops, and their pairing with the file."""
    path = folder / "clean.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    side = OnnxRuntimeRunner(path, promote="all")
    capture = capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])
    return path, capture, align_script_ops(capture, side.nodes,
                                           side.run([x.numpy()]).capture.values, side.model)


def test_ops_made_from_sizes_are_folded_and_the_rest_paired_in_order(tmp_path):
    torch.manual_seed(0)
    model, x = _Recurrence().eval(), torch.randn(2, 4, 8)
    path, capture, alignment = _aligned(model, x, tmp_path)
    folded = {item.name: item.reason for item in alignment.torch_only if item.kind == "sizes"}
    made_from_sizes = [op.name for op in capture.ops if op.kind == "aten::zeros_like"]
    assert made_from_sizes and all(name in folded for name in made_from_sizes)
    assert any("for its size alone" in reason for reason in folded.values())

    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity", report.summary()
    assert report.hidden_divergences == [], report.summary()


class _WrittenThroughAView(nn.Module):
    """``h = zeros_like(x)``, then ``h[:, 0] = ...``: from then on ``h`` holds data."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.zeros_like(x)
        h[:, 0] = x[:, 0] * 3
        y = h * 2
        return self.head(torch.relu(y))


def test_a_tensor_written_through_a_view_is_data_and_compared(tmp_path):
    torch.manual_seed(0)
    model, x = _WrittenThroughAView().eval(), torch.randn(2, 4)
    _, capture, alignment = _aligned(model, x, tmp_path)
    sizes = {item.name for item in alignment.torch_only if item.kind == "sizes"}
    later = [op.name for op in capture.ops if op.kind in ("aten::mul", "aten::relu",
                                                          "aten::linear")]
    assert later and not sizes & set(later), sizes
    paired = {pair.reference.name for pair in alignment.pairs}
    assert {name for name in later if name.startswith(("relu", "linear"))} <= paired


class _TwoStates(nn.Module):
    """Two sums started from ``zeros_like`` of one tensor, stepped together (RWKV's
    numerator and denominator): the exporter's common-subexpression pass makes the two
    zeros, and each one's first product, one node."""

    def __init__(self):
        super().__init__()
        self.key = nn.Linear(8, 8)

    def forward(self, x):
        key = self.key(x)
        numerator = torch.zeros_like(key[:, 0])
        denominator = torch.zeros_like(key[:, 0])
        for index in range(key.shape[1]):
            current = key[:, index]
            decay = (-current.abs()).exp()
            numerator = decay * numerator + current
            denominator = decay * denominator + 1.0
        return numerator / denominator


def test_repeated_ops_merged_by_the_exporter_claim_no_hidden_divergence(tmp_path):
    torch.manual_seed(0)
    model, x = _TwoStates().eval(), torch.randn(2, 4, 8)
    path, _, _ = _aligned(model, x, tmp_path)

    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))

    assert report.verdict == "parity", report.summary()
    assert report.hidden_divergences == [], report.summary()
    assert not any(row.failed for row in report.comparisons), report.table(show="all")
