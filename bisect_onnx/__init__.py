"""bisect-onnx: find where an ONNX export first diverges from its PyTorch model.

The public API is what ``__all__`` lists; everything in submodules not re-exported
here is internal and may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

from bisect_onnx import events  # noqa: E402
from bisect_onnx.api import ExportOptions, RandomInputs, RuntimeOptions, bisect  # noqa: E402
from bisect_onnx.compare import DEFAULT_ATOL, DEFAULT_RTOL  # noqa: E402
from bisect_onnx.errors import (  # noqa: E402
    BisectOnnxError,
    InputError,
    ModelError,
    ParityError,
    UsageError,
)
from bisect_onnx.parity import assert_parity  # noqa: E402
from bisect_onnx.records import Coverage, Record, Report  # noqa: E402
from bisect_onnx.versus import bisect_onnx_models  # noqa: E402

__all__ = [
    # Running a bisection
    "bisect",
    "bisect_onnx_models",
    "ExportOptions",
    "RandomInputs",
    "RuntimeOptions",
    "DEFAULT_RTOL",
    "DEFAULT_ATOL",
    # Parity tests
    "assert_parity",
    "ParityError",
    "events",
    # Results
    "Report",
    "Record",
    "Coverage",
    # Errors
    "BisectOnnxError",
    "UsageError",
    "InputError",
    "ModelError",
    "__version__",
]
