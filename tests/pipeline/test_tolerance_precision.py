"""Against PyTorch, an rtol or atol left to the defaults follows what the file computes in."""

from __future__ import annotations

import onnx
import pytest

import bisect_onnx
from bisect_onnx.report.verdict import verdict_line


def test_a_float16_file_is_judged_by_float16s_defaults_and_says_so(fixture_case, tmp_path):
    pytest.importorskip("onnxconverter_common")
    from bisect_onnx.fixes.precision_convert import float16_keeping

    model, inputs, path = fixture_case("tiny_mlp")
    half = tmp_path / "half.onnx"
    onnx.save(float16_keeping(onnx.load(str(path)), [], keep_io_types=True), str(half))
    report = bisect_onnx.bisect(model, inputs, onnx_model=half)
    assert (report.rtol, report.atol) == (1e-2, 1e-3)
    assert report.tolerance_basis == "float16 defaults: the ONNX file computes in float16"
    assert "float16 defaults" in verdict_line(report)
    assert report.verdict == "parity", verdict_line(report)
    mine = bisect_onnx.bisect(model, inputs, onnx_model=half, tolerance=(1e-4, 1e-6))
    assert mine.tolerance_basis is None and (mine.rtol, mine.atol) == (1e-4, 1e-6)
