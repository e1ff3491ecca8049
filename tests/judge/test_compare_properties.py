"""Property-based tests for bisect_onnx.compare (run only where hypothesis is installed)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from bisect_onnx.judge.compare import Status, compare_arrays  # noqa: E402

SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)
FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)
TOLERANCE = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_infinity=False)


@st.composite
def finite_pairs(draw):
    shape = draw(SHAPES)
    reference = draw(hnp.arrays(np.float64, shape, elements=FINITE))
    # Mostly small perturbations, so both outcomes turn up.
    noise = draw(hnp.arrays(np.float64, shape,
                            elements=st.floats(min_value=-1.0, max_value=1.0)))
    scale = draw(st.sampled_from([0.0, 1e-9, 1e-6, 1e-3, 1.0]))
    return reference, reference + noise * scale


@st.composite
def nonfinite_pairs(draw):
    shape = draw(SHAPES)
    a = draw(hnp.arrays(np.float64, shape, elements=ANY_FLOAT))
    b = draw(hnp.arrays(np.float64, shape, elements=ANY_FLOAT))
    return a, b


@settings(max_examples=300, deadline=None, database=None)
@given(pair=finite_pairs(), rtol=TOLERANCE, atol=TOLERANCE)
def test_status_pass_iff_every_element_within_atol_plus_rtol_times_reference(pair, rtol, atol):
    reference, candidate = pair
    expected = bool(np.all(np.abs(candidate - reference) <= atol + rtol * np.abs(reference)))
    with np.errstate(all="ignore"):  # subnormal references overflow the relative error
        result = compare_arrays(reference, candidate, rtol=rtol, atol=atol)
    assert result.status in (Status.PASS, Status.FAIL)
    assert (result.status == Status.PASS) == expected


@settings(max_examples=300, deadline=None, database=None)
@given(pair=nonfinite_pairs())
def test_nan_inf_agreement_is_symmetric(pair):
    a, b = pair
    with np.errstate(all="ignore"):
        forward = compare_arrays(a, b, rtol=1.0, atol=1e300)
        backward = compare_arrays(b, a, rtol=1.0, atol=1e300)
    assert forward.nan_mismatch == backward.nan_mismatch
    assert (forward.status == Status.NAN_MISMATCH) == (backward.status == Status.NAN_MISMATCH)
    same = (np.isnan(a) & np.isnan(b)) | (a == b)
    expected = int(np.count_nonzero(~(np.isfinite(a) & np.isfinite(b)) & ~same))
    assert forward.nan_mismatch == expected
