"""An ONNX Runtime fusion as the culprit: the optimizer to disable, found and checked.

The planted graph scales its input by 1e38 before a MatMul and by 1e-38 after: run as
written, the scaled input overflows to Inf; ORT's MatMulScaleFusion folds both scales
into the fused kernel's alpha, and the result stays finite. The same file at level
``all`` against itself with optimizations off differs, and only that fusion explains it.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import bisect_onnx
from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.optimizer_fix import (
    MAX_OPTIMIZER_RERUNS,
    optimizers_to_try,
    search_optimizer,
)
from bisect_onnx.fixes.trial import output_figures


def _scaled_matmul(weight_factor: float = 1.0):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 4)).astype(np.float32) * weight_factor
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["scaled"], name="scale_up"),
         helper.make_node("MatMul", ["scaled", "w"], ["product"], name="matmul"),
         helper.make_node("Mul", ["product", "small"], ["y"], name="scale_down")],
        "scaled_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array(1e38, np.float32), "big"),
         numpy_helper.from_array(np.array(1e-38, np.float32), "small"),
         numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = [(rng.standard_normal((2, 8)) * 4).astype(np.float32)]
    return model, inputs


def _optimized_against_plain(tmp_path, candidate=None):
    model, inputs = _scaled_matmul()
    reference = tmp_path / "model.onnx"
    reference.write_bytes(model.SerializeToString())
    path = reference
    if candidate is not None:
        path = tmp_path / "candidate.onnx"
        path.write_bytes(candidate.SerializeToString())
    report = bisect_onnx.bisect_onnx_models(
        reference, path, inputs, suggest_fix=True,
        reference_runtime=bisect_onnx.RuntimeOptions(opt_level="disabled"),
        candidate_runtime=bisect_onnx.RuntimeOptions(opt_level="all"))
    return report, inputs


def test_the_fusion_that_changes_the_result_is_disabled_and_checked(tmp_path):
    report, _ = _optimized_against_plain(tmp_path)
    assert report.diverged
    optimizer = [fix for fix in report.fixes if "disabled_optimizers" in fix.details]
    assert [fix.details["disabled_optimizers"] for fix in optimizer] == [["MatMulScaleFusion"]]
    assert optimizer[0].reaches_parity and not optimizer[0].before.passes
    # The lower level that passes is listed too, below the optimizer (which keeps the rest).
    levels = [fix.details["opt_level"] for fix in report.fixes
              if "disabled_optimizers" not in fix.details]
    assert levels and levels[0] in ("extended", "basic", "disabled")
    # No node alone shows it, and the verdict does not call that a gradual build-up.
    assert report.culprit is None and "an optimization may be the cause" in report.summary()
    assert "builds up gradually" not in report.summary()


def test_a_changed_weight_gets_no_optimizer_fix(tmp_path):
    # The candidate's weight differs: no optimization level brings it to parity.
    candidate, _ = _scaled_matmul(weight_factor=1.5)
    report, _ = _optimized_against_plain(tmp_path, candidate)
    assert report.diverged
    assert not [fix for fix in report.fixes if fix.kind == "optimization"]
    assert not any(fix.reaches_parity for fix in report.fixes)


def test_the_culprit_kernels_maker_is_tried_first():
    assert optimizers_to_try({"name": "/fc/MatMul/MatMulScaleFusion/",
                              "op_type": "FusedMatMul"})[0] == "MatMulScaleFusion"
    assert optimizers_to_try({"name": "fused /conv", "op_type": "FusedConv"})[0] == (
        "ConvActivationFusion")
    tried = optimizers_to_try(None)
    assert len(tried) == MAX_OPTIMIZER_RERUNS == len(set(tried))


def test_a_candidate_run_unoptimized_has_no_optimizer_to_disable():
    model, inputs = _scaled_matmul()
    before = output_figures([np.zeros((2, 4), np.float32)], [np.ones((2, 4), np.float32)],
                            rtol=1e-3, atol=1e-5)
    context = FixContext(culprit_class="optimization", candidate=model,
                         inputs={"x": inputs[0]}, reference_outputs=[np.zeros((2, 4))],
                         before=before, tolerance=bisect_onnx.Tolerance(), opt_level="disabled")
    with pytest.raises(FixUnavailable, match="optimizations off"):
        search_optimizer(context)
