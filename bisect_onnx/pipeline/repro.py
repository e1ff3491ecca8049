"""The repro of one sample's culprit, written the same way for both comparison modes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bisect_onnx.judge.records import Report
from bisect_onnx.report.repro import write_repro
from bisect_onnx.runtime.onnx_side import OnnxRuntimeSide

__all__ = ["write_sample_repro"]


def write_sample_repro(folder: Path, *, report: Report, candidate: OnnxRuntimeSide,
                       failing_value: str, reference_values: Mapping[str, np.ndarray],
                       candidate_values: Mapping[str, np.ndarray],
                       graph_inputs: Mapping[str, np.ndarray], rtol: float, atol: float,
                       reference_label: str) -> dict[str, Any]:
    """Write the minimal repro of ``failing_value``; describe it for the report."""
    repro = write_repro(
        folder,
        model=candidate.model,
        model_dir=candidate.path.resolve().parent,
        failing_value=failing_value,
        reference_values=reference_values,
        candidate_values=candidate_values,
        graph_inputs=graph_inputs,
        rtol=rtol,
        atol=atol,
        environment=report.environment,
        reference_label=reference_label,
    )
    return {"folder": str(repro.folder), "nodes": repro.nodes, "inputs": repro.inputs,
            "reproduces": repro.reproduces}
