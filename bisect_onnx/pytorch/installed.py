"""Whether PyTorch is here: the PyTorch form needs it, a check of a recorded reference not.

torch and onnxscript are the ``torch`` extra (``pip install "bisect-onnx[torch]"``), so
that a machine with a runtime only installs bisect-onnx without them and checks a
reference recorded elsewhere (``bisect-onnx check REF``).
"""

from __future__ import annotations

from bisect_onnx.errors import UsageError

__all__ = ["require_torch", "NO_TORCH"]

NO_TORCH = ("comparing a PyTorch model needs PyTorch, which is not installed here: "
            "pip install \"bisect-onnx[torch]\"; without it, check a reference recorded "
            "where PyTorch runs (bisect-onnx check REF)")


def require_torch() -> None:
    """Refuse the PyTorch form in one line where torch cannot be imported."""
    try:
        import torch  # noqa: F401 (the PyTorch form imports it next anyway)
    except ImportError:
        raise UsageError(NO_TORCH) from None
