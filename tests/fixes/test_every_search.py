"""The fix searches that apply all run, whatever the culprit's class; only what helps is a fix."""

from __future__ import annotations

import numpy as np
import torch

import bisect_onnx
from bisect_onnx.fixes.trial import FixKind
from bisect_onnx.report.verdict import verdict_line


class FloorDivide(torch.nn.Module):
    """Integer floor division of negatives: the TorchScript exporter truncates instead."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.floor_divide(x * 3, 4) + x


def test_an_unclassified_culprit_gets_the_other_export_checked(tmp_path):
    x = np.array([[-7, -5, -1, 0, 3, 9]], dtype=np.int64)
    model = FloorDivide()  # left in training mode: eval mode is tried too, and fixes nothing
    path = tmp_path / "script.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=False)
    report = bisect_onnx.bisect(model, [x], onnx_model=path, suggest_fix=True)
    assert report.verdict == "diverged"
    other = [fix for fix in report.fixes if fix.kind == FixKind.OTHER_EXPORT]
    assert other and other[0].reaches_parity and "dynamo=True" in other[0].change
    assert "the export is the cause" in verdict_line(report).splitlines()[0]
    # A change that leaves the error as it was is said as tried, never listed as a fix.
    assert all(fix.reaches_parity or fix.factor >= 1.5 for fix in report.fixes)
    assert any(note.startswith("tried call model.eval()") for note in report.fix_notes)
