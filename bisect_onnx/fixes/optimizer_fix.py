"""An ONNX Runtime graph optimization as the culprit: the optimizer to disable, checked.

A fusion can change a result: a fused kernel computes in one step what the graph says
in several (a ``Mul`` by 1e38 that overflows to Inf, folded into a ``MatMul``'s alpha,
no longer does). Where the candidate runs optimized, it is rerun (its file untouched)
at each lower optimization level, and where one reaches parity, at its own level with
one optimizer disabled at a time: first those that make the culprit's kernel (by the
kernel's name, which ORT gives the transformer's name, and by its op type), then the
other common fusions. Only reruns that reach parity are fixes; the level that passes is
reported beside the optimizer, which keeps every other optimization.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.registry import register
from bisect_onnx.fixes.trial import FixResult, OutputFigures, output_figures

__all__ = ["search_optimizer", "optimizers_to_try"]

logger = logging.getLogger(__name__)

#: ``runtime/sessions.py``'s level names, lowest first.
_LEVELS = ("disabled", "basic", "extended", "all")

#: The transformers (ORT's ``disabled_optimizers`` names) that make a fused kernel.
_MAKERS = {
    "FusedConv": ("ConvActivationFusion",),
    "FusedMatMul": ("MatMulScaleFusion", "MatmulTransposeFusion"),
    "FusedGemm": ("GemmActivationFusion",),
    "Gemm": ("MatMulAddFusion",),
    "LayerNormalization": ("LayerNormFusion",),
    "SimplifiedLayerNormalization": ("SimplifiedLayerNormFusion",),
    "SkipLayerNormalization": ("SkipLayerNormFusion",),
    "SkipSimplifiedLayerNormalization": ("SkipLayerNormFusion",),
    "Gelu": ("GeluFusion",),
    "BiasGelu": ("BiasGeluFusion",),
    "FastGelu": ("FastGeluFusion",),
    "QuickGelu": ("QuickGeluFusion",),
    "Attention": ("AttentionFusion",),
    "BiasSoftmax": ("BiasSoftmaxFusion",),
}

#: Tried after the culprit kernel's makers: ORT's CPU fusions and rewrites most often
#: met in exported models.
_COMMON = ("MatMulScaleFusion", "MatMulAddFusion", "ConvActivationFusion",
           "GemmActivationFusion", "ConvAddFusion", "ConvMulFusion", "ConvBNFusion",
           "LayerNormFusion", "SimplifiedLayerNormFusion", "GeluFusion", "DivMulFusion",
           "ConstantFolding", "TransposeOptimizer", "NchwcTransformer")

#: At most this many single-optimizer reruns after the level search: the fix search
#: must cost a few comparisons, not one per transformer ORT has.
MAX_OPTIMIZER_RERUNS = 8


def optimizers_to_try(kernel: dict | None) -> list[str]:
    """The optimizers to disable one at a time, the culprit kernel's makers first."""
    named: list[str] = []
    if kernel:
        # ORT names a fused node after its transformer ('/fc/MatMul/MatMulScaleFusion/').
        named += [name for name in {*_COMMON, *(n for m in _MAKERS.values() for n in m)}
                  if name in (kernel.get("name") or "")]
        named += list(_MAKERS.get(kernel.get("op_type") or "", ()))
    return list(dict.fromkeys([*named, *_COMMON]))[:MAX_OPTIMIZER_RERUNS]


def search_optimizer(context: FixContext) -> Sequence[FixResult]:
    """The lower level, and the one optimizer disabled, that bring the run to parity."""
    level = context.opt_level
    if level in (None, "disabled") or level not in _LEVELS:
        raise FixUnavailable("no optimizer search: the candidate runs with graph "
                             "optimizations off")
    if context.candidate_path is None and context.candidate is None:
        raise FixUnavailable("no optimizer search: no ONNX model to rerun")
    started = time.perf_counter()
    results = []
    passing_level = None
    for lower in reversed(_LEVELS[:_LEVELS.index(level)]):  # the highest first
        after = _rerun(context, opt_level=lower)
        if after.passes:
            passing_level = lower
            results.append(_result(context, f"run at graph optimization level {lower!r} "
                                   f"(not {level!r})", after, started,
                                   {"opt_level": lower}))
            break
    if passing_level is None:
        logger.info("no lower optimization level reaches parity: not an optimizer")
        return results
    for name in optimizers_to_try(context.extra.get("culprit_kernel")):
        after = _rerun(context, opt_level=level, disabled=(name,))
        if after.passes:
            results.insert(0, _result(context, f"disable ONNX Runtime's {name} "
                                      f"(SessionOptions disabled_optimizers), at level "
                                      f"{level!r}", after, started,
                                      {"disabled_optimizers": [name], "opt_level": level}))
            break
    return results


def _result(context: FixContext, change: str, after: OutputFigures, started: float,
            details: dict[str, Any]) -> FixResult:
    return FixResult(kind="optimization", change=change, before=context.before, after=after,
                     details=details, seconds=time.perf_counter() - started)


def _rerun(context: FixContext, *, opt_level: str, disabled: Sequence[str] = ()) -> OutputFigures:
    """The candidate's final outputs at ``opt_level`` with ``disabled``, scored."""
    from pathlib import Path

    from bisect_onnx.runtime.onnxruntime.sessions import (
        CPU_PROVIDER,
        SessionSettings,
        create_session,
    )

    path = context.candidate_path
    source = path if path is not None else context.candidate.SerializeToString()
    provider = context.session_keywords.get("provider", CPU_PROVIDER)
    try:
        session = create_session(source, model_dir=path.parent if path else Path.cwd(),
                                 label="optimizer fix", settings=SessionSettings(
                                     provider, opt_level, tuple(disabled)))
        feeds = {value.name: context.inputs[value.name] for value in session.get_inputs()
                 if value.name in context.inputs}
        outputs = [np.asarray(array) for array in session.run(None, feeds)]
    except BisectOnnxError:
        raise
    except Exception as error:  # ORT's own types: one line, not a traceback
        raise FixUnavailable(f"no optimizer search: the rerun failed: "
                             f"{str(error).splitlines()[0]}") from error
    return output_figures(context.reference_outputs, outputs, rtol=context.tolerance.rtol,
                          atol=context.tolerance.atol)


register("optimization", search_optimizer)
