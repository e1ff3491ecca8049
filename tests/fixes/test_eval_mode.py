"""The training-mode fix: ``.eval()`` on a copy, checked against the candidate's outputs."""

import numpy as np
import torch

from bisect_onnx.fixes.context import FixContext
from bisect_onnx.fixes.eval_mode import search_eval_mode
from bisect_onnx.fixes.trial import output_figures
from bisect_onnx.pipeline.options import Tolerance


class WithDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.linear(x))


def _context(model, x, culprit_module):
    with torch.no_grad():
        evaluated = WithDropout()
        evaluated.load_state_dict(model.state_dict())
        candidate = [evaluated.eval()(x).numpy()]  # what an eval-mode export computes
        torch.manual_seed(0)
        reference = [model(x).numpy()]
    tolerance = Tolerance(1e-4, 1e-5)
    before = output_figures(reference, candidate, rtol=1e-4, atol=1e-5)
    return FixContext(culprit_class="pytorch mode", candidate=None, inputs={"x": x.numpy()},
                      reference_outputs=reference, candidate_outputs=candidate,
                      before=before, tolerance=tolerance, torch_model=model,
                      torch_inputs=(x,), culprit_module=culprit_module)


def test_eval_of_the_culprit_module_is_a_checked_fix_and_the_model_is_left_alone():
    torch.manual_seed(0)
    model = WithDropout().train()
    x = torch.randn(4, 8)
    context = _context(model, x, "drop")
    assert not context.before.passes
    results = search_eval_mode(context)
    assert [r.change for r in results] == ["call model.drop.eval()"]
    assert results[0].reaches_parity and results[0].after.max_abs < 1e-5
    assert model.training and model.drop.training  # the user's object as it was


def test_without_a_known_module_the_whole_model_is_switched():
    torch.manual_seed(0)
    model = WithDropout().train()
    results = search_eval_mode(_context(model, torch.randn(4, 8), "no.such.module"))
    assert [r.change for r in results] == ["call model.eval()"]
    assert results[0].reaches_parity
    assert np.isfinite(results[0].factor) or results[0].after.max_abs == 0


class Dropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.drop(self.linear(x)))


def test_bisect_of_a_model_in_training_mode_suggests_eval_checked(recwarn):
    import bisect_onnx

    torch.manual_seed(0)
    model = Dropped().train()
    report = bisect_onnx.bisect(model, torch.randn(4, 8).numpy(), suggest_fix=True)
    assert report.diverged
    fixes = [fix for fix in report.fixes if fix.reaches_parity]
    assert fixes and fixes[0].change in ("call model.drop.eval()", "call model.eval()")
    assert fixes[0].before.max_abs > fixes[0].after.max_abs
    assert report.to_dict()["fixes"][0]["reaches_parity"] is True
    assert model.training and model.drop.training


def test_without_suggest_fix_no_fix_is_searched(recwarn):
    import bisect_onnx

    torch.manual_seed(0)
    report = bisect_onnx.bisect(Dropped().train(), torch.randn(4, 8).numpy())
    assert report.fixes == () and report.fix_notes == ()
