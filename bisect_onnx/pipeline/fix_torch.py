"""The fix stage of a PyTorch-against-ONNX run: its context from one sample's values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bisect_onnx.fixes.stage import FixesFound
    from bisect_onnx.judge.reading import Reading
    from bisect_onnx.pipeline.torch_settings import Settings
    from bisect_onnx.runtime.sides import CapturedValue
    from bisect_onnx.search.baked_shapes import BakedShapes

__all__ = ["torch_sample_fixes"]


def torch_sample_fixes(reading: Reading, settings: Settings, arrays: Sequence[np.ndarray],
                 torch_outputs: Sequence[CapturedValue],
                 onnx_outputs: Sequence[CapturedValue],
                 baked: BakedShapes | None = None) -> FixesFound:
    """The fix searches' checked results for the culprit ``reading`` names.

    ``torch_outputs`` / ``onnx_outputs``: the final outputs the verdict compared
    (``CapturedValue``s), the figures every fix's ``before`` is made from. ``baked``:
    the shapes the export baked in, checked; then the export calls that keep them
    symbolic are searched instead of other exports at this run's shapes, every one of
    which would reach parity without fixing the file.
    """
    from bisect_onnx.fixes.baked_fix import BAKED_SHAPES_KEY
    from bisect_onnx.fixes.stage import search_fixes
    from bisect_onnx.pipeline.fix_onnx import session_settings
    from bisect_onnx.pytorch.module_side import split_keywords, to_tensor

    prepared = settings.prepared
    args, kwargs = split_keywords([to_tensor(array) for array in arrays], prepared.keywords)
    candidate = prepared.candidate
    model = settings.reference.exportable
    training = any(getattr(module, "training", False) for module in
                   (model.modules() if hasattr(model, "modules") else ()))
    # Every search that applies runs, whatever the culprit's class: another export
    # (exporter, opset) for a model, eval mode for one in training mode.
    exports = ("baked shape",) if baked is not None else ("exporter",)
    extra = {BAKED_SHAPES_KEY: baked} if baked is not None else {}
    return search_fixes(
        reading, also=(*exports, *(("pytorch mode",) if training else ())), extra=extra,
        candidate=candidate.model,
        candidate_path=candidate.path,
        inputs={spec.name: array for spec, array in zip(candidate.inputs, arrays,
                                                        strict=False)},
        reference_outputs=[value.array for value in torch_outputs],
        candidate_outputs=[value.array for value in onnx_outputs],
        tolerance=settings.judge.base, torch_model=settings.reference.exportable,
        torch_inputs=tuple(args), torch_keywords=kwargs, memory_budget=settings.budget,
        **session_settings(candidate.optimizer_settings()))
