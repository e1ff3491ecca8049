"""How one step's value is judged against PyTorch's: its largest error and its verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bisect_onnx.decode.steps import _deviation

EXPECTED = np.array([[100.0, 1.0, -2.0, 0.0]], dtype=np.float32)


@pytest.mark.parametrize(("error", "passed"), [
    ([0.0, 0.0, 0.0, 0.0], True),
    ([0.0, 5e-6, 0.0, -5e-6], True),  # within atol
    ([0.05, 0.0, 0.0, 0.0], True),  # over atol, within rtol of 100
    ([0.0, 0.05, 0.0, 0.0], False),  # the same error at 1.0 is not
    ([0.0, 0.0, 0.0, 2e-5], False),  # over atol at zero
])
def test_an_error_passes_within_atol_plus_rtol_of_the_reference(error, passed):
    actual = EXPECTED + np.array([error], dtype=np.float32)
    deviation = _deviation(EXPECTED, actual, rtol=1e-3, atol=1e-5)
    expected_error = np.abs(actual.astype(np.float64) - EXPECTED).max()
    assert deviation.passed is passed
    assert deviation.max_abs == pytest.approx(expected_error, rel=1e-12, abs=0)


def test_a_nan_fails_and_the_largest_finite_error_is_kept():
    actual = EXPECTED.copy()
    actual[0, 1] = np.nan
    actual[0, 2] = -2.5
    deviation = _deviation(EXPECTED, actual, rtol=1e-3, atol=1e-5)
    assert not deviation.passed and deviation.max_abs == pytest.approx(0.5)


def test_all_nan_fails_with_no_error_to_show():
    deviation = _deviation(EXPECTED, np.full_like(EXPECTED, np.nan), rtol=1e-3, atol=1e-5)
    assert not deviation.passed and math.isnan(deviation.max_abs)


def test_another_shape_fails_and_an_empty_value_passes():
    assert _deviation(EXPECTED, EXPECTED[:, :2], rtol=1e-3, atol=1e-5).passed is False
    empty = np.zeros((1, 0), dtype=np.float32)
    assert _deviation(empty, empty, rtol=1e-3, atol=1e-5).passed is True


def test_non_finite_values_agree_as_the_judge_rules():
    # A NaN against a NaN, an infinity against the same one: the model computes them so,
    # on both sides, and one forward's comparison lets them agree too.
    from bisect_onnx.judge.compare import compare_arrays

    expected = np.array([[np.nan, np.inf, -np.inf, 1.0]], dtype=np.float32)
    for actual, passed in ((expected.copy(), True),
                           (np.array([[np.nan, np.inf, -np.inf, 1.5]], np.float32), False),
                           (np.array([[np.nan, -np.inf, -np.inf, 1.0]], np.float32), False),
                           (np.array([[0.0, np.inf, -np.inf, 1.0]], np.float32), False)):
        deviation = _deviation(expected, actual, rtol=1e-3, atol=1e-5)
        assert deviation.passed is passed
        assert compare_arrays(expected, actual, rtol=1e-3, atol=1e-5).passed is passed
    assert _deviation(expected, expected.copy(), rtol=1e-3, atol=1e-5).max_abs == 0.0
    mixed = _deviation(expected, np.array([[np.nan, np.inf, -np.inf, 1.5]], np.float32),
                       rtol=1e-3, atol=1e-5)
    assert mixed.max_abs == pytest.approx(0.5)
