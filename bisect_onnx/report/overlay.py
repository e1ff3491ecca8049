"""Per-node error for Google's Model Explorer ("node data" JSON, loaded beside the ONNX file).

The format is Model Explorer's ``ModelNodeData``: graph id -> ``{"results": {key:
{"value": ...}}, "thresholds": [...]}``, where a key may be any output tensor name of
a node. Each compared ONNX value gets the smallest atol that would let it pass (with
the report's rtol), so the colour says at a glance how far each node is from passing;
the first divergence is drawn in a colour of its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bisect_onnx.errors import InputError
from bisect_onnx.judge.records import Report

__all__ = ["model_explorer_data", "write_model_explorer"]

# Stand-in for "no atol can pass" (NaN/Inf in different places, shape mismatch):
# JSON has no infinity, and any finite threshold must sit below it.
_NEVER_PASSES = 1e30
_PASS, _NEAR, _FAIL, _CULPRIT = "#c8e6c9", "#fff59d", "#ef9a9a", "#d32f2f"


def model_explorer_data(report: Report) -> dict[str, Any]:
    """The node-data structure for the report's candidate graph."""
    results: dict[str, dict[str, Any]] = {}
    culprit = report.first_divergence
    for record in [*report.comparisons, *report.final_outputs]:
        needed = record.min_passing_atol
        value = _NEVER_PASSES if needed is None or not math.isfinite(needed) else needed
        entry: dict[str, Any] = {"value": value}
        if culprit is not None and record.onnx_value == culprit.onnx_value:
            entry.update(bgColor=_CULPRIT, textColor="#ffffff")
        results[record.onnx_value] = entry
    atol = report.atol
    thresholds = [
        {"value": atol, "bgColor": _PASS},            # passes as the report was run
        {"value": max(10 * atol, 1e-12), "bgColor": _NEAR},  # within 10x of passing
        {"value": _NEVER_PASSES, "bgColor": _FAIL},
    ]
    graph = report.candidate.get("graph") or "main_graph"
    return {graph: {"results": results, "thresholds": thresholds}}


def write_model_explorer(report: Report, path: Path) -> None:
    """Write the node data to ``path``, a file the user named."""
    try:
        Path(path).write_text(json.dumps(model_explorer_data(report), indent=2) + "\n",
                              encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the Model Explorer data to {path}: {error.strerror}; "
                         "choose a writable path for --model-explorer") from error
