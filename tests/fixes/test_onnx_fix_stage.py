"""bisect_onnx_models(..., suggest_fix=True): the registry's ONNX searches, end to end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import bisect_onnx
from bisect_onnx.fixes.precision_rerun import run_model
from bisect_onnx.fixes.registry import searches_for
from bisect_onnx.fixes.stage import search_fixes  # noqa: F401  (imports the registrations)
from bisect_onnx.fixes.trial import output_figures
from tests.fixes.precision_models import cancellation_model, large_weight_model, to_bfloat16
from tests.fixes.test_qdq_fix import _float_and_qdq


def test_the_onnx_searches_are_registered_by_precision():
    names = {kind: [s.__name__ for s in searches_for(kind)]
             for kind in ("float16", "bfloat16", "qdq")}
    assert names == {"float16": ["search_float32_keep_list"],
                     "bfloat16": ["search_float32_keep_list"],
                     "qdq": ["search_nodes_to_exclude"]}


def test_a_planted_qdq_scale_gets_a_checked_fix(tmp_path):
    reference, qdq, inputs = _float_and_qdq(tmp_path)
    for tensor in qdq.graph.initializer:
        if tensor.name == "w2_scale":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 8, tensor.name))
    report = bisect_onnx.bisect_onnx_models(reference, qdq, inputs, suggest_fix=True)
    assert report.diverged
    fixes = [fix for fix in report.fixes if fix.reaches_parity]
    assert fixes and fixes[0].details["nodes_to_exclude"] == ["mm2"]
    fixed = onnx.load_from_string(fixes[0].fixed_model)
    assert fixes[0].after.passes and not fixes[0].before.passes
    # The fixed copy, rerun here, is as close as the fix says.
    figures = output_figures(run_model(reference, inputs), run_model(fixed, inputs),
                             rtol=0.05, atol=1.0)
    assert abs(figures.max_abs - fixes[0].after.max_abs) < 1e-5
    # And the run itself, judging the fixed copy by its own QDQ tolerance, passes it.
    assert not bisect_onnx.bisect_onnx_models(reference, fixed, inputs).diverged


@pytest.mark.parametrize("build", [large_weight_model, cancellation_model])
def test_a_float16_candidate_gets_a_checked_keep_list(build):
    pytest.importorskip("onnxconverter_common")
    from bisect_onnx.fixes.precision_convert import float16_keeping

    reference = build()
    candidate = float16_keeping(reference, [], keep_io_types=True)
    inputs = {"x": np.random.default_rng(0).normal(0, 1, (4, 32)).astype(np.float32)}
    report = bisect_onnx.bisect_onnx_models(reference, candidate, inputs, suggest_fix=True)
    assert report.diverged
    [fix] = [fix for fix in report.fixes if fix.reaches_parity]
    block = fix.details["node_block_list"]
    assert 0 < len(block) < len(reference.graph.node)
    # Judged by the run's own float16 tolerance, the fixed model passes on a rerun.
    again = bisect_onnx.bisect_onnx_models(reference, onnx.load_from_string(fix.fixed_model),
                                           inputs)
    assert not again.diverged


def test_write_fixed_writes_the_fixed_model_and_refuses_an_input(tmp_path):
    from bisect_onnx.errors import UsageError

    reference, qdq, inputs = _float_and_qdq(tmp_path)
    for tensor in qdq.graph.initializer:
        if tensor.name == "w2_scale":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 8, tensor.name))
    onnx.save(qdq, tmp_path / "planted.onnx")
    with pytest.raises(UsageError, match="never written"):
        bisect_onnx.bisect_onnx_models(
            tmp_path / "float.onnx", tmp_path / "planted.onnx", inputs,
            suggest_fix=bisect_onnx.FixOptions(suggest=True,
                                               write_fixed=tmp_path / "planted.onnx"))
    bisect_onnx.bisect_onnx_models(
        tmp_path / "float.onnx", tmp_path / "planted.onnx", inputs,
        suggest_fix=bisect_onnx.FixOptions(suggest=True, write_fixed=tmp_path / "fixed.onnx"))
    fixed = onnx.load(tmp_path / "fixed.onnx")
    assert not bisect_onnx.bisect_onnx_models(reference, fixed, inputs).diverged


def test_a_bfloat16_candidate_gets_a_checked_keep_list():
    reference = cancellation_model()
    inputs = {"x": np.random.default_rng(0).normal(0, 1, (4, 32)).astype(np.float32)}
    report = bisect_onnx.bisect_onnx_models(reference, to_bfloat16(reference), inputs,
                                            suggest_fix=True)
    assert report.diverged
    [fix] = [fix for fix in report.fixes if fix.reaches_parity]
    assert fix.details["precision"] == "bfloat16"
    again = bisect_onnx.bisect_onnx_models(reference, onnx.load_from_string(fix.fixed_model),
                                           inputs)
    assert not again.diverged
