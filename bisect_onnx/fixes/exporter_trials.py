"""One export tried, in a temporary folder, and measured against PyTorch's outputs.

The model is exported with some settings, run in ONNX Runtime's CPU provider on the
run's inputs, and its final outputs compared with PyTorch's by ``output_figures``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import BisectOnnxError, one_line
from bisect_onnx.fixes.trial import OutputFigures, output_figures
from bisect_onnx.pytorch.reexport import ExportCall

if TYPE_CHECKING:
    import torch

__all__ = ["ExportAttempt", "try_export", "torch_outputs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportAttempt:
    """What one export gave: its figures, or why it could not be measured."""

    settings: ExportCall
    figures: OutputFigures | None
    """The rerun's figures against PyTorch's outputs; ``None`` where it failed."""
    failure: str | None
    """One line: why the export or its run failed; ``None`` where it ran."""
    seconds: float
    model_bytes: bytes | None = None
    """The exported file, where it is one self-contained file."""

    def describe(self) -> str:
        """``dynamo=False, opset_version=17: max abs 0.0953, 1 of 1 outputs fail``."""
        if self.figures is None:
            return f"{self.settings.describe()}: failed ({self.failure})"
        verdict = ("passes" if self.figures.passes else
                   f"{self.figures.failing_outputs} of {self.figures.outputs} outputs fail")
        return f"{self.settings.describe()}: max abs {self.figures.max_abs:.3g}, {verdict}"


def try_export(model: torch.nn.Module, args: Sequence[object], kwargs: Mapping[str, object],
               settings: ExportCall, *, reference_outputs: Sequence[np.ndarray],
               rtol: float, atol: float) -> ExportAttempt:
    """Export ``model`` with ``settings``, run it in ONNX Runtime (CPU), measure it.

    The temporary folder is removed before this returns; the user's model is only
    traced (both exporters leave its parameters and mode as they were).
    """
    from bisect_onnx.pytorch.exporting import export_model

    started = time.perf_counter()
    arrays = [_array(value) for value in (*args, *kwargs.values())]
    try:
        with tempfile.TemporaryDirectory(prefix="bisect-onnx-export-fix-") as folder:
            exported = export_model(model, arrays, Path(folder), exporter=settings.exporter,
                                    opset=settings.opset, options=dict(settings.options),
                                    keywords=tuple(kwargs))
            outputs = _run(exported.path, arrays)
            files = [path for path in Path(folder).iterdir() if path.is_file()]
            model_bytes = exported.path.read_bytes() if len(files) == 1 else None
    except (BisectOnnxError, _RunFailed) as error:
        logger.info("export fix: %s failed: %s", settings.describe(), error)
        return ExportAttempt(settings, None, one_line(error), time.perf_counter() - started)
    figures = output_figures(reference_outputs, outputs, rtol=rtol, atol=atol)
    logger.info("export fix: %s: max abs %.3g, %d failing output(s)", settings.describe(),
                figures.max_abs, figures.failing_outputs)
    return ExportAttempt(settings, figures, None, time.perf_counter() - started, model_bytes)


class _RunFailed(Exception):
    """The export does not run in ONNX Runtime, or not on these inputs."""


def _run(path: Path, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The export's final outputs in ONNX Runtime's CPU provider, fed by position.

    The exporters name inputs differently (``x`` and ``input.1``) but keep their
    order, the forward's; an export that dropped an unused input is fed by count.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # ORT's C++ log off stderr: its errors raise
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # an export ORT refuses is that candidate's failure
        raise _RunFailed(f"ONNX Runtime cannot load it: {one_line(error)}") from error
    names = [value.name for value in session.get_inputs()]
    if len(names) > len(arrays):
        raise _RunFailed(f"it takes {len(names)} inputs, the run has {len(arrays)}")
    try:
        outputs = session.run(None, dict(zip(names, arrays, strict=False)))
    except Exception as error:
        raise _RunFailed(f"ONNX Runtime cannot run it: {one_line(error)}") from error
    return [np.asarray(output) for output in outputs]


def _array(value: object) -> np.ndarray:
    """A forward argument as the array export_model takes."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def torch_outputs(model: torch.nn.Module, args: Sequence[object],
                  kwargs: Mapping[str, object]) -> list[np.ndarray]:
    """PyTorch's final outputs, tensors depth first, as arrays (the reference of a search)."""
    import torch

    with torch.no_grad():
        output = model(*args, **kwargs)
    return _flat(output)


def _flat(output: object) -> list[np.ndarray]:
    """A forward's tensors, depth first in order."""
    if hasattr(output, "detach"):
        return [output.detach().cpu().numpy()]
    if isinstance(output, Mapping):
        return [array for value in output.values() for array in _flat(value)]
    if isinstance(output, (list, tuple)):
        return [array for value in output for array in _flat(value)]
    return []
