"""Rerunning a changed copy of a model in ONNX Runtime (CPU) and scoring it.

Every fix search of :mod:`bisect_onnx.fixes.precision_fix` and
:mod:`bisect_onnx.fixes.qdq_fix` tries its changes through :class:`Rerun`, so each
keep-list or exclusion list it reports carries the figures of a run that happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import onnx

from bisect_onnx.errors import InputError, ModelError
from bisect_onnx.fixes.trial import OutputFigures, output_figures
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.runtime.memory import default_budget, format_size

__all__ = ["run_model", "Rerun", "check_copy_fits"]

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def run_model(model: onnx.ModelProto | bytes, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's final outputs in ONNX Runtime on CPU, graph optimizations off.

    Optimizations are off so the rerun measures the precision change, not a fusion.
    """
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # ORT's C++ log off stderr: its errors raise
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        # A float16 candidate converted without keep_io_types takes float16 inputs.
        feeds = {value.name: np.asarray(inputs[value.name]).astype(_NUMPY[value.type])
                 if value.type in _NUMPY else inputs[value.name]
                 for value in session.get_inputs() if value.name in inputs}
        return list(session.run(None, feeds))
    except Exception as error:  # ORT raises its own types; keep its reason on one line
        raise ModelError(f"a fix candidate could not run in ONNX Runtime: "
                         f"{str(error).splitlines()[0]}") from error


def check_copy_fits(model: onnx.ModelProto, max_memory: int | None) -> None:
    """Refuse a fix search whose working copies of the model would not fit the budget.

    A search holds the model, one changed copy and its serialized form at a time.
    """
    budget = default_budget() if max_memory is None else max_memory
    size = model.ByteSize()
    if budget is not None and 3 * size > budget:
        raise InputError(f"the fix search needs copies of a {format_size(size)} model, "
                         f"more than the memory budget of {format_size(budget)}; "
                         "raise --max-memory or skip --suggest-fix")


class Rerun:
    """Runs candidate models against the reference's outputs and counts the runs."""

    def __init__(self, reference_outputs: list[np.ndarray], inputs: Mapping[str, np.ndarray],
                 *, tolerance: Tolerance) -> None:
        self.reference_outputs = reference_outputs
        self.inputs = inputs
        self.tolerance = tolerance
        self.runs = 0

    def figures(self, model: onnx.ModelProto | bytes) -> OutputFigures:
        """The figures of one rerun of ``model``."""
        self.runs += 1
        outputs = run_model(model, self.inputs)
        return output_figures(self.reference_outputs, outputs, rtol=self.tolerance.rtol,
                              atol=self.tolerance.atol)

    def failing_or(self, make: Callable[[], onnx.ModelProto | bytes]) -> OutputFigures:
        """The rerun's figures, or failing ones where the changed copy cannot be made or run.

        onnxconverter-common can write a model ONNX Runtime refuses (mixed float types
        around a blocked node): that keep-list is no fix, and the search goes on.
        """
        try:
            model = make()
        except Exception:  # the converter raises what it likes
            return OutputFigures(math.inf, math.inf, len(self.reference_outputs),
                                 len(self.reference_outputs))
        try:
            return self.figures(model)
        except ModelError:
            return OutputFigures(math.inf, math.inf, len(self.reference_outputs),
                                 len(self.reference_outputs))
