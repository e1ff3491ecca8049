"""The fix dispatcher: searches run by culprit class, failures become one-line reasons."""

import numpy as np
import pytest

from bisect_onnx.errors import InputError
from bisect_onnx.fixes import registry
from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.trial import FixKind, FixResult, output_figures
from bisect_onnx.pipeline.options import Tolerance

WANT = [np.array([1.0, 2.0], dtype=np.float32)]


def _context(culprit_class: str) -> FixContext:
    before = output_figures(WANT, [np.array([1.0, 3.0], dtype=np.float32)], rtol=0, atol=1e-3)
    return FixContext(culprit_class=culprit_class, candidate=None, inputs={},
                      reference_outputs=WANT, before=before, tolerance=Tolerance(0, 1e-3))


def _rerun(context: FixContext) -> list[FixResult]:
    after = output_figures(context.reference_outputs, [WANT[0] + 1e-4],
                           rtol=context.tolerance.rtol, atol=context.tolerance.atol)
    return [FixResult(FixKind.EVAL_MODE, "call model.eval()", context.before, after)]


def _unavailable(context: FixContext) -> list[FixResult]:
    raise FixUnavailable("no float32 reference")


def _bad_input(context: FixContext) -> list[FixResult]:
    raise InputError("the candidate is too large for a copy under --max-memory")


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_SEARCHES", {})


def test_registered_search_runs_and_its_result_is_a_fix(clean_registry):
    registry.register("pytorch mode", _rerun)
    outcome = registry.suggest_fixes(_context("pytorch mode"))
    assert [fix.change for fix in outcome.fixes] == ["call model.eval()"]
    assert outcome.tried == ("_rerun",)
    assert registry.suggest_fixes(_context("qdq")).results == ()


def test_searches_that_cannot_run_give_one_line_reasons(clean_registry):
    registry.register("float16", _unavailable)
    registry.register("float16", _bad_input)
    registry.register("float16", _rerun)
    outcome = registry.suggest_fixes(_context("float16"))
    assert outcome.reasons == ("no fix search: no float32 reference",
                               "no fix search: the candidate is too large for a copy "
                               "under --max-memory")
    assert len(outcome.fixes) == 1


def test_no_search_for_a_class_says_so(clean_registry):
    outcome = registry.suggest_fixes(_context("graph edit"))
    assert outcome.reasons == ("no fix search for a graph edit culprit",)
    with pytest.raises(ValueError):
        registry.register("no such class", _rerun)
