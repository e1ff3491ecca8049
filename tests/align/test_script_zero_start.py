"""TorchScript files of sums started from ``0`` (issue 49: false hidden divergences).

``score = 0`` then ``score += a`` then ``score += b`` (DeBERTa's disentangled
attention): ``remove_mutation`` moves the ``a + 0`` after the ops computing ``b``, and
the pairing took the node of the second sum for it, a hidden divergence on a clean
file. ``total = 0`` then ``total = total + a`` (FocalNet's context aggregation):
TorchScript's peephole pass removes the ``a + 0``, and the pairing took the next sum's
node for it, shifting every op after it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.align.script_ops import align_script_ops
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED


class _InPlaceFromZero(nn.Module):
    """``score = 0; score += a; score += b`` as DeBERTa writes it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        score = 0
        score += h.sigmoid()
        b = (h * 0.5).tanh()
        score += b.transpose(-1, -2).transpose(-1, -2)
        return score * h


class _LoopFromZero(nn.Module):
    """``total = 0; total = total + level * gate`` over levels, as FocalNet writes it."""

    def __init__(self):
        super().__init__()
        self.levels = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        gates = x.sigmoid()
        total = 0
        for index, level in enumerate(self.levels):
            x = level(x)
            total = total + x * gates[:, index:index + 1]
        return total + x.mean(-1, keepdim=True) * gates[:, 2:3]


def _export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    return path


@pytest.mark.parametrize("model_class", [_InPlaceFromZero, _LoopFromZero])
def test_a_clean_file_of_a_sum_from_zero_claims_no_hidden_divergence(tmp_path, model_class):
    torch.manual_seed(0)
    model, x = model_class().eval(), torch.randn(4, 8)
    path = _export(model, x, tmp_path / "clean.onnx")

    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))

    assert report.verdict == "parity", report.summary()
    assert report.hidden_divergences == [], report.summary()
    assert not any(record.failed for record in report.comparisons)


def test_a_removed_sum_with_zero_is_compared_at_its_input(tmp_path):
    """The peephole pass removed ``x * g + 0``: its row is the product's value."""
    torch.manual_seed(0)
    model, x = _LoopFromZero().eval(), torch.randn(4, 8)
    path = _export(model, x, tmp_path / "clean.onnx")
    side = OnnxRuntimeRunner(path, promote="all")
    capture = capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])
    alignment = align_script_ops(capture, side.nodes, side.run([x.numpy()]).capture.values,
                                 side.model)

    first_sum = next(op.name for op in capture.ops if op.kind == "aten::add")
    removed = {item.name: item for item in alignment.torch_only}
    assert removed[first_sum].kind == "removed", removed.get(first_sum)
    assert "peephole" in removed[first_sum].reason



def test_only_a_number_makes_a_sum_an_identity():
    """A constant tensor argument (LeViT's attention bias) is no 0: asked, not compared."""
    from bisect_onnx.align.script_table import identity_by_constant
    from bisect_onnx.pytorch.script_ops import Argument, ScriptOp

    def add(*constants):
        return ScriptOp("add", "aten::add", "", (Argument("value", "x"), *(
            Argument("constant", constant) for constant in constants)))

    assert identity_by_constant(add(0, 1))
    assert not identity_by_constant(add(2, 1))
    assert not identity_by_constant(add(torch.zeros(3), 1))
    assert not identity_by_constant(add(True, 1))
