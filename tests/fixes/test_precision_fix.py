"""The float32 keep-list search on planted float16 and bfloat16 failures, rerun in ORT."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bisect_onnx.errors import InputError
from bisect_onnx.fixes.precision_convert import float16_keeping
from bisect_onnx.fixes.precision_fix import find_float32_keep_list
from bisect_onnx.fixes.precision_rerun import run_model
from bisect_onnx.fixes.trial import FixKind, output_figures
from bisect_onnx.judge.tolerances import Tolerance
from tests.fixes.precision_models import cancellation_model, large_weight_model, to_bfloat16

pytest.importorskip("onnxconverter_common")

RTOL, ATOL = 1e-2, 1e-3
TOLERANCE = Tolerance(RTOL, ATOL)
INPUTS = {"x": np.random.default_rng(0).normal(0, 1, (4, 32)).astype(np.float32)}


@pytest.mark.parametrize("build", [large_weight_model, cancellation_model])
def test_float16_keep_list_is_small_passes_and_reconverts(build):
    reference = build()
    candidate = float16_keeping(reference, [], keep_io_types=True)
    [fix] = find_float32_keep_list(reference, candidate, INPUTS, tolerance=TOLERANCE)
    assert fix.kind == FixKind.KEEP_FLOAT32
    assert not fix.before.passes and fix.reaches_parity
    block = fix.details["node_block_list"]
    assert 0 < len(block) < len(reference.graph.node)
    # The user's own call with the reported list gives the fixed model's passing outputs.
    want = run_model(reference, INPUTS)
    fixed = run_model(fix.fixed_model, INPUTS)
    again = run_model(float16_keeping(reference, block, keep_io_types=True), INPUTS)
    assert output_figures(want, fixed, rtol=RTOL, atol=ATOL).passes
    for ours, theirs in zip(fixed, again, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert fix.details["op_block_list_nodes"] >= len(block)


def test_start_from_the_culprit_keeps_it():
    reference = large_weight_model()
    candidate = float16_keeping(reference, [], keep_io_types=True)
    [fix] = find_float32_keep_list(reference, candidate, INPUTS, tolerance=TOLERANCE,
                                   start=["scale_up"])
    assert fix.details["node_block_list"] == ["scale_up"] and fix.reaches_parity


@pytest.mark.parametrize("build", [large_weight_model, cancellation_model])
def test_bfloat16_keep_list_puts_the_nodes_back_in_float32(build):
    reference = build()
    candidate = to_bfloat16(reference)
    [fix] = find_float32_keep_list(reference, candidate, INPUTS, tolerance=TOLERANCE)
    assert fix.details["precision"] == "bfloat16"
    assert not fix.before.passes and fix.reaches_parity
    assert 0 < fix.details["nodes_kept_float32"] < fix.details["nodes"]
    fixed = onnx.load_from_string(fix.fixed_model)
    assert output_figures(run_model(reference, INPUTS), run_model(fixed, INPUTS),
                          rtol=RTOL, atol=ATOL).passes


def test_a_candidate_already_within_tolerance_gets_no_fix():
    reference = large_weight_model()
    candidate = float16_keeping(reference, [], keep_io_types=True)
    loose = Tolerance(1.0, 10.0)
    assert find_float32_keep_list(reference, candidate, INPUTS, tolerance=loose) == []


def test_a_model_too_large_for_the_budget_is_refused_in_one_line():
    reference = large_weight_model()
    candidate = float16_keeping(reference, [], keep_io_types=True)
    with pytest.raises(InputError, match="memory budget") as error:
        find_float32_keep_list(reference, candidate, INPUTS, tolerance=TOLERANCE, max_memory=100)
    assert "\n" not in str(error.value)
