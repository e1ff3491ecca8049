"""Parity checks for test suites: cheap when parity holds, a bisection when it breaks.

``assert_parity`` first compares only the final outputs (one plain ONNX Runtime
session, nothing promoted). Only when they disagree does it run the full
bisection, and raise :class:`~bisect_onnx.errors.ParityError` with the verdict and
the table rows around the culprit, so a CI log says *where* parity broke.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from bisect_onnx.api import (
    ExportOptions,
    _arrange,
    _as_arrays,
    _export_candidate,
    _given_candidate,
    _keywords,
    _resolve_export,
    bisect,
)
from bisect_onnx.compare import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerances, compare_arrays
from bisect_onnx.errors import ParityError
from bisect_onnx.events import PARITY_CHECKED, emit
from bisect_onnx.loading import check_against_onnx
from bisect_onnx.reference import reference_for
from bisect_onnx.report.json import write_json

__all__ = ["assert_parity"]


def assert_parity(
    model: Any,
    inputs: Any,
    onnx_model: Any = None,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    export: ExportOptions | None = None,
    artifacts_dir: str | Path | None = None,
    name: str | None = None,
) -> None:
    """Assert that the ONNX model's final outputs match the PyTorch model's.

    Args:
        model: What :func:`bisect_onnx.bisect` takes (an ``nn.Module``, a program, a path).
        inputs: The inputs, as :func:`bisect_onnx.bisect` takes them.
        onnx_model: The export under test; without it the model is exported here.
        rtol: Relative tolerance (``|onnx - torch| > atol + rtol * |torch|`` fails).
        atol: Absolute tolerance.
        export: How to export when ``onnx_model`` is not given.
        artifacts_dir: Where a failing check writes its report (``<name>.json`` and
            ``<name>.html``) and the repro of its first divergence (``<name>.repro/``).
        name: The check's name in messages and artifact file names.

    Raises:
        ParityError: A final output is out of tolerance; ``.report`` holds the bisection.
    """
    check_tolerances(rtol, atol)
    reference = reference_for(model, label=name)
    label = name or reference.side.describe().get("class", "model")
    given = _as_arrays(inputs)
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-parity-") as workdir:
        if onnx_model is None:
            options = _resolve_export(reference, None, export)
            candidate, capture, _ = _export_candidate(reference, given, options, Path(workdir))
            arrays = _arrange(reference, candidate, given)
        else:
            candidate, _, _ = _given_candidate(reference, onnx_model, Path(workdir))
            arrays = _arrange(reference, candidate, given)
            check_against_onnx(arrays, candidate.inputs)
            capture = reference.side.run(arrays, keywords=_keywords(reference, given))
        outputs = candidate.run_outputs(arrays)
        agree = len(outputs) == len(capture.outputs) and all(
            compare_arrays(ref.array, cand.array, rtol=rtol, atol=atol).passed
            for ref, cand in zip(capture.outputs, outputs, strict=True))
        emit(PARITY_CHECKED, f"{label}: {'parity' if agree else 'diverged'}")
        if agree:
            return
    stem = _file_name(label)
    folder = Path(artifacts_dir) if artifacts_dir is not None else None
    report = bisect(model, inputs, onnx_model=onnx_model, rtol=rtol, atol=atol, export=export,
                    model_label=name,
                    repro_dir=folder / f"{stem}.repro" if folder is not None else None)
    if folder is not None:
        from bisect_onnx.report.html import write_html

        folder.mkdir(parents=True, exist_ok=True)
        write_json(report, folder / f"{stem}.json")
        write_html(report, folder / f"{stem}.html")
    raise ParityError(f"ONNX parity of {label} broke.\n{report.summary()}\n\n{report.table()}",
                      report)


def _file_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "model"
