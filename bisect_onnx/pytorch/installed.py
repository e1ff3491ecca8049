"""Whether PyTorch is here: the PyTorch form needs it, a check of a recorded reference not.

torch and onnxscript are the ``torch`` extra (``pip install "bisect-onnx[torch]"``), so
that a machine with a runtime only installs bisect-onnx without them and checks a
reference recorded elsewhere (``bisect-onnx check REF``).
"""

from __future__ import annotations

import importlib.util

from bisect_onnx.errors import UsageError

__all__ = ["require_torch", "NO_TORCH"]

NO_TORCH = ("comparing a PyTorch model needs PyTorch, which is not installed here: "
            "pip install \"bisect-onnx[torch]\"; without it, check a reference recorded "
            "where PyTorch runs (bisect-onnx check REF)")


def require_torch() -> None:
    """Refuse the PyTorch form in one line where torch is not installed.

    Found without importing it (seconds): a mistyped model path still has its answer
    at once.
    """
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a torch module without a spec
        found = False
    if not found:
        raise UsageError(NO_TORCH)
