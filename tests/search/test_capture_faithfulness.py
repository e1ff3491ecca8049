"""Whether a capture computes production's outputs: judged against the tolerance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.modes import FAITHFUL_SHARE, outputs_differ, tolerance_share


def outputs(*arrays):
    return [CapturedValue(f"out{index}", np.asarray(array), Provenance(position=index))
            for index, array in enumerate(arrays)]


PRODUCTION = np.array([1.0, -2.0, 0.0, 100.0], dtype=np.float32)


def test_rounding_far_under_the_tolerance_is_faithful():
    capture = PRODUCTION * np.float32(1 + 1e-6)  # another kernel's rounding, about
    share = tolerance_share(outputs(capture), outputs(PRODUCTION), rtol=1e-3, atol=1e-5)
    assert 0 < share < FAITHFUL_SHARE
    assert not outputs_differ(outputs(capture), outputs(PRODUCTION), rtol=1e-3, atol=1e-5)
    assert outputs_differ(outputs(capture), outputs(PRODUCTION))  # bitwise, untold


def test_a_difference_that_uses_the_tolerance_differs_and_says_how_much():
    capture = PRODUCTION.copy()
    capture[2] = 5e-6  # half of atol where the value is 0
    share = tolerance_share(outputs(capture), outputs(PRODUCTION), rtol=1e-3, atol=1e-5)
    assert share == pytest.approx(0.5, rel=1e-3)
    assert outputs_differ(outputs(capture), outputs(PRODUCTION), rtol=1e-3, atol=1e-5)


def test_equal_outputs_use_none_of_it():
    assert tolerance_share(outputs(PRODUCTION), outputs(PRODUCTION.copy()), rtol=1e-3,
                           atol=1e-5) == 0.0


@pytest.mark.parametrize("capture", [
    np.array([np.nan, -2.0, 0.0, 100.0], dtype=np.float32),
    np.array([1.0, -2.0, 0.0, np.inf], dtype=np.float32),
    PRODUCTION[:3],
    (PRODUCTION + 1).astype(np.float64),
])
def test_nan_infinity_shape_or_dtype_on_one_side_only_is_never_faithful(capture):
    assert tolerance_share(outputs(capture), outputs(PRODUCTION), rtol=1e-3,
                           atol=1e-5) == math.inf


def test_zero_tolerance_means_bitwise():
    capture = PRODUCTION + np.float32(1e-6)
    assert tolerance_share(outputs(capture), outputs(PRODUCTION), rtol=0.0,
                           atol=0.0) == math.inf


def test_the_worst_output_decides():
    fine, bad = PRODUCTION.copy(), PRODUCTION.copy()
    bad[0] += np.float32(1e-3)
    share = tolerance_share(outputs(fine, bad), outputs(PRODUCTION, PRODUCTION), rtol=1e-3,
                            atol=1e-5)
    assert share > 0.9
