"""bisect-onnx: find where an ONNX export first diverges from its PyTorch model.

The public API is what ``__all__`` lists; everything in submodules not re-exported
here is internal and may change.
"""

from __future__ import annotations

from bisect_onnx import events
from bisect_onnx.decode.options import DecodeOptions
from bisect_onnx.decode.run import bisect_decode
from bisect_onnx.decode.step_report import DecodeReport
from bisect_onnx.errors import (
    BisectOnnxError,
    BisectOnnxWarning,
    InputError,
    ModelError,
    ParityError,
    RuntimeRefused,
    UsageError,
)
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.judge.records import Coverage, Record, Report
from bisect_onnx.pipeline.check_reference import check
from bisect_onnx.pipeline.onnx_vs_onnx import bisect_onnx_models
from bisect_onnx.pipeline.options import (
    ExportOptions,
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.parity import assert_parity
from bisect_onnx.pipeline.pytorch_vs_onnx import bisect
from bisect_onnx.reference.loaded import Reference
from bisect_onnx.reference.recording import record
from bisect_onnx.sources.input_samples import Samples
from bisect_onnx.version import __version__

__all__ = [
    # Running a bisection
    "bisect",
    "bisect_onnx_models",
    # A decoder with its key/value cache, stepped
    "bisect_decode",
    "DecodeOptions",
    "DecodeReport",
    "Samples",
    "RandomInputs",
    "Tolerance",
    "ExportOptions",
    "RuntimeOptions",
    "SearchOptions",
    "FixOptions",
    "OutputOptions",
    "DEFAULT_RTOL",
    "DEFAULT_ATOL",
    # A reference recorded where PyTorch runs, checked where the runtime runs
    "record",
    "check",
    "Reference",
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
    "RuntimeRefused",
    "BisectOnnxWarning",
    "__version__",
]
