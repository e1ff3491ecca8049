"""A fix result's verdict comes from its rerun's figures, never from its search."""

import math

import numpy as np

from bisect_onnx.fixes.trial import FixKind, FixResult, output_figures


def _figures(candidate):
    return output_figures([np.ones(4, np.float32)], [candidate], rtol=1e-3, atol=1e-5)


def test_a_rerun_within_tolerance_is_a_fix_and_one_outside_is_only_an_improvement():
    before = _figures(np.full(4, 1.5, np.float32))
    near = _figures(np.full(4, 1.01, np.float32))
    exact = _figures(np.ones(4, np.float32))
    improvement = FixResult(FixKind.KEEP_FLOAT32, "keep n1", before, near)
    fix = FixResult(FixKind.KEEP_FLOAT32, "keep n1 n2", before, exact)
    assert not improvement.reaches_parity
    assert math.isclose(improvement.factor, 0.5 / 0.01, rel_tol=1e-3)
    assert fix.reaches_parity and fix.as_dict()["factor"] is None  # error went to 0


def test_a_float16_output_is_compared_in_the_references_type():
    figures = _figures(np.ones(4, np.float16))
    assert figures.passes and figures.max_abs == 0


def test_nan_where_the_reference_has_a_number_is_an_infinite_error():
    figures = _figures(np.array([1, np.nan, 1, 1], np.float32))
    assert not figures.passes and figures.max_abs == math.inf
    assert figures.as_dict()["max_abs"] is None


def test_a_missing_output_fails():
    figures = output_figures([np.ones(2), np.ones(2)], [np.ones(2)], rtol=0, atol=0)
    assert not figures.passes
