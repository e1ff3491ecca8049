"""OpenVINO's CPU plugin: its runner, capture plan, executed layers and sessions.

An optional package (``pip install bisect-onnx[openvino]``): :data:`ENTRY` imports it
only when a runner is made or its settings checked, so a missing package is a
one-line error and nothing else pays for it.
"""

from __future__ import annotations

from pathlib import Path

from bisect_onnx.errors import UsageError
from bisect_onnx.runtime.runner import Runner, RunnerSettings, RuntimeEntry

__all__ = ["ENTRY", "OV_PRECISIONS", "check_precision"]

#: OpenVINO's ``INFERENCE_PRECISION_HINT`` values; ``None`` keeps the device's default
#: (bf16 on CPUs with AMX or AVX-512 BF16, else f32).
OV_PRECISIONS = ("f32", "f16", "bf16")


def check_precision(precision: str) -> None:
    """A one-line error for a precision OpenVINO does not take."""
    if precision not in OV_PRECISIONS:
        raise UsageError(f"unknown OpenVINO precision {precision!r}; choose one of "
                         f"{', '.join(OV_PRECISIONS)}")


def _make(path: Path, settings: RunnerSettings) -> Runner:
    from bisect_onnx.runtime.openvino.runner import OpenVinoRunner

    return OpenVinoRunner(path, precision=settings.precision, promote=settings.promote)


def _check(settings: RunnerSettings) -> None:
    from bisect_onnx.runtime.onnxruntime.sessions import (
        CPU_PROVIDER,
        DEFAULT_OPT_LEVEL,
        check_runtime,
    )
    from bisect_onnx.runtime.openvino.sessions import import_openvino

    if settings.precision is not None:
        check_precision(settings.precision)
    import_openvino()
    # The provider and level are ONNX Runtime's: only their defaults (the options'
    # own) may come along, whatever they name (a provider this onnxruntime lacks is
    # still not OpenVINO's); a wrong promotion is named as for ONNX Runtime.
    given = [name for name, value, default in (
        ("provider (--provider)", settings.provider, CPU_PROVIDER),
        ("opt_level (--opt-level)", settings.opt_level, DEFAULT_OPT_LEVEL)) if value != default]
    if given:
        raise UsageError(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} ONNX "
                         "Runtime's; OpenVINO compiles the model for its CPU device itself: "
                         f"drop {'them' if len(given) > 1 else 'it'} with runtime openvino")
    check_runtime(settings.provider, settings.opt_level, settings.promote)


ENTRY = RuntimeEntry("openvino", "OpenVINO", "openvinotoolkit/openvino", _make, _check)
