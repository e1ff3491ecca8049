"""The environment record of a run: versions, machine and runtime settings, in one place."""

from __future__ import annotations

import os
import platform
from typing import Any

from bisect_onnx.runtime.runner import Runner
from bisect_onnx.version import __version__

__all__ = ["environment"]


def environment(candidate: Runner, *, exporter: str,
                reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a bug report needs to reproduce the run.

    ``reference``: the reference runtime's settings when the reference is an ONNX model
    (its runtime, provider and level); ``None`` when it is PyTorch, whose version and
    the CPU's name are recorded instead.
    """
    import onnx
    import onnxruntime

    record: dict[str, Any] = {
        "bisect_onnx": __version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    if reference is None:
        import torch

        record.update({"torch": torch.__version__, "cpu": _cpu_name(),
                       "intra_op_threads": "onnxruntime default (one per physical core)"})
    else:
        record.update(reference)
    # OpenVINO's version and inference precision are in the report's ``candidate``.
    record.update({"runtime": candidate.runtime,
                   "provider": candidate.provider, "opt_level": candidate.opt_level,
                   "promote": candidate.promote, "exporter": exporter,
                   "opset": candidate.opset})
    return record


def _cpu_name() -> str:
    """The CPU's model name (numerics differ between CPUs: AVX-512 kernels, say)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
