"""Large float32 arrays are compared in float32 first: the figures must be float64's exactly."""

from __future__ import annotations

import numpy as np
import pytest

import bisect_onnx.judge.compare as compare


def float64_only(reference, candidate, *, rtol, atol):
    """The comparison with the float32 screen switched off."""
    saved = compare._SCREEN_FROM
    compare._SCREEN_FROM = 1 << 62
    try:
        return compare.compare_arrays(reference, candidate, rtol=rtol, atol=atol)
    finally:
        compare._SCREEN_FROM = saved


def cases(seed):
    rng = np.random.default_rng(seed)
    size = 4 * int(rng.integers(compare._SCREEN_FROM, 2 * compare._SCREEN_CHUNK))
    scale = float(10.0 ** rng.integers(-35, 35))
    reference = (rng.standard_normal(size) * scale).astype(np.float32)
    noise = (rng.standard_normal(size) * scale).astype(np.float32)
    yield reference, reference + noise * np.float32(1e-4)          # float noise
    one = reference.copy()
    one[rng.integers(size)] *= np.float32(1.001)                    # one element off
    yield reference, one
    yield reference, np.nextafter(reference, np.float32(np.inf))    # one ulp everywhere
    zeros = reference.copy()
    zeros[: size // 2] = 0                                          # exact zeros
    yield zeros, zeros + np.float32(1e-5) * rng.choice([0, 1], size).astype(np.float32)
    yield reference, reference * np.float32(1 + 1e-3)               # right at rtol
    yield reference, reference.copy()                               # identical
    yield reference.reshape(4, -1)[:, ::2], reference.reshape(4, -1)[:, 1::2]  # views


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("rtol", "atol"), [(1e-3, 1e-5), (0.0, 0.0), (1e-5, 1e-30),
                                            (0.1, 1e3)])
def test_every_figure_equals_the_float64_comparison(seed, rtol, atol):
    for reference, candidate in cases(seed):
        screened = compare.compare_arrays(reference, candidate, rtol=rtol, atol=atol)
        assert screened == float64_only(reference, candidate, rtol=rtol, atol=atol)


def test_an_atol_exactly_at_an_elements_error_is_settled_in_float64():
    reference = np.linspace(1, 2, 2 * compare._SCREEN_FROM, dtype=np.float32)
    candidate = reference.copy()
    candidate[7] = np.nextafter(candidate[7], np.float32(3))
    needed = float64_only(reference, candidate, rtol=0.0, atol=0.0).min_passing_atol
    for atol in (needed, float(np.nextafter(needed, 0)), float(np.nextafter(needed, 1))):
        assert (compare.compare_arrays(reference, candidate, rtol=0.0, atol=atol)
                == float64_only(reference, candidate, rtol=0.0, atol=atol))


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_non_finite_values_take_the_float64_path(special):
    reference = np.ones(2 * compare._SCREEN_FROM, dtype=np.float32)
    candidate = reference.copy()
    candidate[3] = special
    result = compare.compare_arrays(reference, candidate, rtol=1e-3, atol=1e-5)
    assert result == float64_only(reference, candidate, rtol=1e-3, atol=1e-5)
    assert result.nan_mismatch == 1


def test_float32_overflow_takes_the_float64_path():
    big = float(np.finfo(np.float32).max)
    reference = np.full(2 * compare._SCREEN_FROM, big, dtype=np.float32)
    candidate = -reference  # the float32 difference overflows; the float64 one does not
    result = compare.compare_arrays(reference, candidate, rtol=1e-3, atol=1e-5)
    assert result == float64_only(reference, candidate, rtol=1e-3, atol=1e-5)
    assert result.status == "fail" and result.max_abs_error == pytest.approx(2.0 * big)
