"""The PyTorch form's judge: one base tolerance, the first matching rule, unused rules named."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_onnx.align.modules import Pair
from bisect_onnx.errors import UsageError
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.tolerances import Tolerance, ToleranceRule
from bisect_onnx.runtime.sides import CapturedValue

LOOSE = ToleranceRule("relu_*", Tolerance(0.1, 0.1), "tol.txt:1")
UNUSED = ToleranceRule("never_*", Tolerance(1.0, 1.0), "tol.txt:2")


def pair(onnx_name: str, off_by: float) -> Pair:
    reference = np.ones((2, 3), dtype=np.float32)
    return Pair(CapturedValue("block", reference, Provenance(position=0)),
                CapturedValue(onnx_name, reference + off_by, Provenance(position=0)))


def test_a_value_matching_a_rule_is_judged_and_marked_by_it():
    judge = ToleranceJudge.from_floats(1e-3, 1e-5, [LOOSE, UNUSED])
    loose = judge.record(0, pair("relu_3", 0.05)).figures
    strict = judge.record(1, pair("conv2d", 0.05)).figures
    assert loose.status == "pass" and (loose.rtol, loose.atol) == (0.1, 0.1)
    assert strict.status == "fail" and (strict.rtol, strict.atol) == (None, None)


def test_any_of_a_values_names_can_match():
    judge = ToleranceJudge.from_floats(1e-3, 1e-5, [LOOSE])
    assert judge.tolerance("val_12", "relu_3") == LOOSE.tolerance
    assert judge.tolerance("val_12", None) == judge.base
    assert judge.compare(np.zeros(2), np.full(2, 0.05), "val_12", "relu_1").passed


def test_rules_that_matched_nothing_are_named():
    judge = ToleranceJudge.from_floats(1e-3, 1e-5, [LOOSE, UNUSED])
    judge.record(0, pair("relu_3", 0.0))
    (warning,) = judge.unused_warnings()
    assert warning.code == "unused-tolerance-rule" and "tol.txt:2" in warning


def test_bad_base_tolerances_are_refused_once_here():
    with pytest.raises(UsageError, match="rtol must be a finite number"):
        ToleranceJudge.from_floats(float("nan"), 1e-5)
