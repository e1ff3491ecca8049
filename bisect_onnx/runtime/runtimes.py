"""Which runtime runs an ONNX side, and the one-line errors for one that cannot.

ONNX Runtime is the default. OpenVINO is an optional package
(``pip install bisect-onnx[openvino]``): it is imported only here, when asked for, so
nothing else pays for it and a missing package is a one-line error.
"""

from __future__ import annotations

from typing import Any

from bisect_onnx.errors import UsageError

__all__ = ["ONNXRUNTIME", "OPENVINO", "RUNTIMES", "OV_PRECISIONS", "check_runtime_name",
           "import_openvino", "display_name", "REPOSITORIES"]

ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
RUNTIMES = (ONNXRUNTIME, OPENVINO)
#: How the report names each runtime, and where its kernel bugs are filed: the one
#: place a new runtime's name is written.
DISPLAY_NAMES = {ONNXRUNTIME: "ONNX Runtime", OPENVINO: "OpenVINO"}
REPOSITORIES = {ONNXRUNTIME: "microsoft/onnxruntime", OPENVINO: "openvinotoolkit/openvino"}
#: OpenVINO's ``INFERENCE_PRECISION_HINT`` values; ``None`` keeps the device's default
#: (bf16 on CPUs with AMX or AVX-512 BF16, else f32).
OV_PRECISIONS = ("f32", "f16", "bf16")


def display_name(runtime: str | None) -> str:
    """The runtime's name in the report's sentences (ONNX Runtime where none is said)."""
    return DISPLAY_NAMES.get(runtime or ONNXRUNTIME, runtime or DISPLAY_NAMES[ONNXRUNTIME])


def import_openvino() -> Any:
    """The ``openvino`` package, or a one-line error saying how to install it."""
    try:
        import openvino
    except ImportError as error:
        raise UsageError(f"runtime openvino needs OpenVINO, which is not importable "
                         f"({error}); pip install bisect-onnx[openvino]") from None
    return openvino


def check_runtime_name(name: str, precision: str | None) -> None:
    """A one-line error for a runtime that is unknown or not installed, or a stray precision."""
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")
    if precision is not None and precision not in OV_PRECISIONS:
        raise UsageError(f"unknown OpenVINO precision {precision!r}; choose one of "
                         f"{', '.join(OV_PRECISIONS)}")
    if name == OPENVINO:
        import_openvino()
    elif precision is not None:
        raise UsageError("an OpenVINO precision (--ov-precision) applies to runtime "
                         "openvino; drop it, or add --runtime openvino")
