"""A module left in training mode: ``.eval()`` on a copy, checked by rerunning PyTorch.

The culprit class "pytorch mode" (``search/nodeless.py``) says a Dropout or BatchNorm
ran in training mode in PyTorch while the export is in eval mode. The search switches
a deep copy to eval mode, first the culprit's module alone, then the whole model, and
compares the copy's outputs with the candidate's (ONNX Runtime's) outputs. The user's
model object is never touched.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.exporter_trials import torch_outputs
from bisect_onnx.fixes.registry import register
from bisect_onnx.fixes.trial import FixKind, FixResult, output_figures

if TYPE_CHECKING:
    import torch

__all__ = ["search_eval_mode"]


def search_eval_mode(context: FixContext) -> list[FixResult]:
    """Try ``model.<culprit module>.eval()``, then ``model.eval()``; stop at a fix."""
    import torch

    model = context.torch_model
    if not isinstance(model, torch.nn.Module):
        raise FixUnavailable("no PyTorch module to switch to eval mode")
    if not context.candidate_outputs:
        raise FixUnavailable("no candidate outputs to compare an eval-mode rerun with")
    results: list[FixResult] = []
    for module_path in _targets(model, context.culprit_module):
        started = time.perf_counter()
        trial = copy.deepcopy(model)
        target = trial.get_submodule(module_path) if module_path else trial
        target.eval()
        outputs = torch_outputs(trial, context.torch_inputs, context.torch_keywords)
        after = output_figures(outputs, context.candidate_outputs,
                               rtol=context.tolerance.rtol, atol=context.tolerance.atol)
        change = f"call model.{module_path}.eval()" if module_path else "call model.eval()"
        results.append(FixResult(FixKind.EVAL_MODE, change, context.before, after,
                                 details={"module": module_path or None},
                                 seconds=time.perf_counter() - started))
        if results[-1].reaches_parity:
            break
    return results


def _targets(model: torch.nn.Module, culprit_module: str | None) -> list[str]:
    """The culprit's module (where it names one of the model's), then the whole model."""
    targets = []
    if culprit_module:
        names = dict(model.named_modules())
        if culprit_module in names and culprit_module:
            targets.append(culprit_module)
    targets.append("")
    return targets


register("pytorch mode", search_eval_mode)
