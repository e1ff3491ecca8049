"""Unit tests for bisect_onnx.judge.compare: the single place where arrays are judged."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from bisect_onnx.errors import UsageError
from bisect_onnx.judge.compare import Status, check_tolerances, compare_arrays

# reference 4.0, rtol 0.25, atol 0.5: the allowed error is exactly 0.5 + 0.25 * 4 = 1.5,
# and every number involved is a binary fraction, so the boundary is exact in float64.
REF = 4.0
RTOL = 0.25
ATOL = 0.5
LIMIT = ATOL + RTOL * abs(REF)


def compare(reference, candidate, *, rtol=0.0, atol=0.0):
    return compare_arrays(np.asarray(reference), np.asarray(candidate), rtol=rtol, atol=atol)


# --- pass / fail boundary -----------------------------------------------------------


def test_identical_float_arrays_pass_with_zero_error():
    a = np.array([[1.5, -2.0], [0.0, 3.25]], dtype=np.float32)
    result = compare(a, a.copy())
    assert result.status == Status.PASS
    assert result.passed
    assert result.max_abs_error == 0.0
    assert result.max_rel_error == 0.0
    assert result.mismatch_fraction == 0.0
    assert result.min_passing_atol == 0.0
    assert result.nan_mismatch == 0
    assert result.shape == (2, 2)
    assert result.dtype == "float32"


def test_error_exactly_at_the_limit_passes():
    assert LIMIT == 1.5
    result = compare([REF], [REF + LIMIT], rtol=RTOL, atol=ATOL)
    assert result.status == Status.PASS
    assert result.max_abs_error == LIMIT


def test_error_one_ulp_above_the_limit_fails():
    candidate = np.nextafter(REF + LIMIT, np.inf)
    result = compare([REF], [candidate], rtol=RTOL, atol=ATOL)
    assert result.status == Status.FAIL
    assert not result.passed
    assert result.mismatch_fraction == 1.0


def test_error_one_ulp_below_the_limit_passes():
    candidate = np.nextafter(REF + LIMIT, -np.inf)
    assert compare([REF], [candidate], rtol=RTOL, atol=ATOL).status == Status.PASS


def test_error_below_the_reference_fails_just_past_the_limit():
    below = REF - LIMIT
    assert compare([REF], [below], rtol=RTOL, atol=ATOL).status == Status.PASS
    past = np.nextafter(below, -np.inf)
    assert compare([REF], [past], rtol=RTOL, atol=ATOL).status == Status.FAIL


def test_rtol_scales_with_magnitude_of_a_negative_reference():
    assert compare([-REF], [-REF - LIMIT], rtol=RTOL, atol=ATOL).status == Status.PASS
    past = np.nextafter(-REF - LIMIT, -np.inf)
    assert compare([-REF], [past], rtol=RTOL, atol=ATOL).status == Status.FAIL


def test_rtol_uses_the_reference_not_the_candidate():
    # |b| = 1 gives 0.5 * 1 = 0.5 allowed; |a| = 3 would give 1.5 and wrongly pass.
    assert compare([1.0], [3.0], rtol=0.5).status == Status.FAIL
    # Swapped, |b| = 3 allows 1.5, still short of the 2.0 error.
    assert compare([3.0], [1.0], rtol=0.5).status == Status.FAIL
    assert compare([4.0], [2.0], rtol=0.5).status == Status.PASS


def test_float32_inputs_use_the_same_boundary():
    ref = np.array([REF], dtype=np.float32)
    assert compare(ref, np.array([REF + LIMIT], np.float32), rtol=RTOL, atol=ATOL).passed
    above = np.nextafter(np.float32(REF + LIMIT), np.float32(np.inf))
    assert not compare(ref, np.array([above], np.float32), rtol=RTOL, atol=ATOL).passed


# --- NaN and Inf ----------------------------------------------------------------------


def test_nan_in_the_same_place_on_both_sides_passes():
    ref = np.array([1.0, np.nan, 3.0])
    result = compare(ref, ref.copy())
    assert result.status == Status.PASS
    assert result.nan_mismatch == 0
    assert result.min_passing_atol == 0.0


def test_nan_on_one_side_only_is_a_nan_mismatch():
    ref = np.array([1.0, np.nan, 3.0, 4.0])
    cand = np.array([1.0, 2.0, np.nan, 4.0])
    result = compare(ref, cand, rtol=1.0, atol=1e9)
    assert result.status == Status.NAN_MISMATCH
    assert result.nan_mismatch == 2
    assert result.min_passing_atol is None
    assert result.mismatch_fraction == pytest.approx(2 / 4)
    assert not result.passed


def test_nan_mismatch_outranks_a_plain_failure():
    result = compare([0.0, np.nan], [10.0, 1.0])
    assert result.status == Status.NAN_MISMATCH
    assert result.nan_mismatch == 1
    assert result.mismatch_fraction == 1.0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_positive_infinity_on_both_sides_passes():
    result = compare([np.inf, 1.0], [np.inf, 1.0])
    assert result.status == Status.PASS
    assert result.nan_mismatch == 0


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_negative_infinity_on_both_sides_passes():
    assert compare([-np.inf], [-np.inf]).status == Status.PASS


def test_infinities_of_opposite_sign_fail():
    result = compare([np.inf, 1.0], [-np.inf, 1.0], rtol=1.0, atol=1e9)
    assert result.status == Status.NAN_MISMATCH
    assert result.nan_mismatch == 1
    assert result.min_passing_atol is None


def test_infinity_against_nan_fails():
    result = compare([np.inf], [np.nan])
    assert result.status == Status.NAN_MISMATCH
    assert result.nan_mismatch == 1


def test_infinity_against_a_finite_value_fails():
    assert compare([1e308], [np.inf], rtol=1.0, atol=1e308).status == Status.NAN_MISMATCH


def test_infinities_compare_without_numpy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = compare([-np.inf, 1.0], [-np.inf, 1.0])
    assert result.passed


# --- shape and dtype ------------------------------------------------------------------


def test_shape_mismatch_status_and_shapes():
    result = compare(np.zeros((2, 3)), np.zeros((3, 2)), atol=1e9)
    assert result.status == Status.SHAPE_MISMATCH
    assert result.shape == (2, 3)
    assert result.candidate_shape == (3, 2)
    assert result.max_abs_error is None
    assert result.min_passing_atol is None
    assert not result.passed


def test_same_size_different_rank_is_a_shape_mismatch():
    assert compare(np.zeros(6), np.zeros((1, 6))).status == Status.SHAPE_MISMATCH


def test_dtype_mismatch_status_even_with_equal_values():
    result = compare(np.ones(3, np.float32), np.ones(3, np.float64), atol=1e9)
    assert result.status == Status.DTYPE_MISMATCH
    assert result.dtype == "float32"
    assert result.candidate_dtype == "float64"
    assert result.min_passing_atol is None


def test_int_against_float_is_a_dtype_mismatch():
    assert compare(np.ones(2, np.int64), np.ones(2, np.float32)).status == Status.DTYPE_MISMATCH


# --- integers and booleans ------------------------------------------------------------


def test_equal_integers_pass():
    a = np.array([0, -5, 7], dtype=np.int64)
    result = compare(a, a.copy())
    assert result.status == Status.PASS
    assert result.min_passing_atol == 0.0


def test_integer_difference_of_one_fails_despite_huge_tolerances():
    result = compare(np.array([0, 10], np.int64), np.array([0, 11], np.int64),
                     rtol=1.0, atol=1e9)
    assert result.status == Status.FAIL
    assert result.max_abs_error == 1.0
    assert result.mismatch_fraction == 0.5
    assert result.min_passing_atol is None


def test_unsigned_integer_difference_does_not_wrap_around():
    result = compare(np.array([0], np.uint8), np.array([255], np.uint8), atol=1e9)
    assert result.status == Status.FAIL
    assert result.max_abs_error == 255.0


def test_int64_difference_beyond_float64_precision_fails():
    big = 2**53
    result = compare(np.array([big], np.int64), np.array([big + 1], np.int64), atol=1e9)
    assert result.status == Status.FAIL


def test_int64_difference_beyond_float64_precision_reports_nonzero_error():
    big = 2**53
    result = compare(np.array([big], np.int64), np.array([big + 1], np.int64))
    assert result.max_abs_error == 1.0


def test_boolean_mismatch_fails_despite_huge_tolerances():
    result = compare(np.array([True, False]), np.array([True, True]), rtol=1.0, atol=1e9)
    assert result.status == Status.FAIL
    assert result.mismatch_fraction == 0.5
    assert result.min_passing_atol is None


def test_equal_booleans_pass():
    a = np.array([True, False, True])
    assert compare(a, a.copy()).status == Status.PASS


# --- figures ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_zero_size_arrays_pass(dtype):
    result = compare(np.zeros((0, 3), dtype), np.zeros((0, 3), dtype))
    assert result.status == Status.PASS
    assert result.mismatch_fraction == 0.0


def test_zero_size_arrays_of_different_shape_are_a_shape_mismatch():
    assert compare(np.zeros((0, 3)), np.zeros((3, 0))).status == Status.SHAPE_MISMATCH


def test_max_rel_error_ignores_zero_references():
    result = compare([0.0, 2.0], [5.0, 3.0])
    assert result.max_abs_error == 5.0
    assert result.max_rel_error == 0.5
    assert math.isfinite(result.max_rel_error)


def test_max_rel_error_is_zero_when_every_reference_is_zero():
    result = compare([0.0, 0.0], [1.0, -1.0])
    assert result.max_rel_error == 0.0
    assert result.max_abs_error == 1.0


def test_mismatch_fraction_counts_failing_elements():
    ref = np.zeros(8)
    cand = np.array([0, 0.5, 0, 2.0, 0, 0, 3.0, 0])
    result = compare(ref, cand, atol=1.0)
    assert result.status == Status.FAIL
    assert result.mismatch_fraction == 2 / 8


def test_mismatch_fraction_counts_nan_mismatches_and_failures_together():
    result = compare([0.0, 0.0, 1.0, 1.0], [np.nan, 5.0, 1.0, 1.0])
    assert result.mismatch_fraction == 2 / 4


@pytest.mark.parametrize("rtol", [0.0, 1e-3, 0.1])
def test_min_passing_atol_passes_and_anything_smaller_fails(rtol):
    rng = np.random.default_rng(1234)
    ref = rng.normal(size=(4, 5)) * 10.0
    cand = ref + rng.normal(size=(4, 5)) * 0.1
    result = compare(ref, cand, rtol=rtol)
    needed = result.min_passing_atol
    assert result.status == Status.FAIL
    assert needed is not None and needed > 0
    assert compare(ref, cand, rtol=rtol, atol=needed).status == Status.PASS
    assert compare(ref, cand, rtol=rtol, atol=needed * (1 - 1e-9)).status == Status.FAIL


def test_min_passing_atol_is_zero_when_rtol_alone_passes():
    result = compare([100.0], [100.5], rtol=0.01)
    assert result.status == Status.PASS
    assert result.min_passing_atol == 0.0


def test_min_passing_atol_is_the_exact_excess_over_rtol():
    # error 1.5, rtol * |b| = 1.0: atol must be 0.5, all exact in binary.
    result = compare([REF], [REF + LIMIT], rtol=RTOL)
    assert result.min_passing_atol == LIMIT - RTOL * REF


def test_min_passing_atol_passes_when_the_subtraction_rounds():
    ref = np.array([0.5 + 2.0**-52])
    cand = np.array([2.0 + 2.0**-51])  # diff 1.5 + 2**-52; rtol*|b| = 0.25 + 2**-53
    needed = compare(ref, cand, rtol=0.5).min_passing_atol
    assert compare(ref, cand, rtol=0.5, atol=needed).status == Status.PASS


# --- check_tolerances -------------------------------------------------------------------


@pytest.mark.parametrize("rtol, atol", [(0.0, 0.0), (1e-3, 1e-5), (1, 0), (10.0, 1e6)])
def test_check_tolerances_accepts_finite_non_negative(rtol, atol):
    assert check_tolerances(rtol, atol) is None


@pytest.mark.parametrize(
    "rtol, atol, bad",
    [
        (-1e-3, 1e-5, "rtol"),
        (1e-3, -1e-5, "atol"),
        (math.nan, 1e-5, "rtol"),
        (1e-3, math.nan, "atol"),
        (math.inf, 1e-5, "rtol"),
        (1e-3, math.inf, "atol"),
        (1e-3, -math.inf, "atol"),
    ],
)
def test_check_tolerances_refuses_negative_nan_and_infinite(rtol, atol, bad):
    with pytest.raises(UsageError) as caught:
        check_tolerances(rtol, atol)
    message = str(caught.value)
    assert message.startswith(bad)
    assert "\n" not in message


def test_check_tolerances_refuses_a_string():
    with pytest.raises(UsageError):
        check_tolerances("1e-3", 1e-5)


def test_check_tolerances_accepts_numpy_scalars():
    assert check_tolerances(np.float32(1e-3), np.float64(1e-5)) is None


@pytest.mark.parametrize(("reference", "candidate", "status"), [
    (np.float32(2.0), np.float32(2.0), "pass"),
    (np.float32(2.0), np.float32(2.5), "fail"),
    (np.float64(0.0), np.float64(np.nan), "nan_mismatch"),
])
def test_zero_dimensional_arrays_compare_like_any_other(reference, candidate, status):
    result = compare_arrays(np.array(reference), np.array(candidate), rtol=1e-3, atol=1e-5)
    assert result.status == status
    assert result.shape == ()
