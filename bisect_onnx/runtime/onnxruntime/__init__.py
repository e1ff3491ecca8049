"""ONNX Runtime, the default runtime: its runner, capture plan, placement and sessions.

:data:`ENTRY` is what the registry (:mod:`bisect_onnx.runtime.registry`) lists; it
imports nothing of ONNX Runtime until a runner is made or its settings checked.
"""

from __future__ import annotations

from pathlib import Path

from bisect_onnx.errors import UsageError
from bisect_onnx.runtime.runner import Runner, RunnerSettings, RuntimeEntry

__all__ = ["ENTRY"]


def _make(path: Path, settings: RunnerSettings) -> Runner:
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    return OnnxRuntimeRunner(path, provider=settings.provider, opt_level=settings.opt_level,
                             promote=settings.promote)


def _check(settings: RunnerSettings) -> None:
    from bisect_onnx.runtime.onnxruntime.sessions import check_runtime
    from bisect_onnx.runtime.openvino import check_precision

    if settings.precision is not None:
        check_precision(settings.precision)  # a wrong one is named as such first
        raise UsageError("an OpenVINO precision (--ov-precision) applies to runtime "
                         "openvino; drop it, or add --runtime openvino")
    check_runtime(settings.provider, settings.opt_level, settings.promote)


ENTRY = RuntimeEntry("onnxruntime", "ONNX Runtime", "microsoft/onnxruntime", _make, _check)
