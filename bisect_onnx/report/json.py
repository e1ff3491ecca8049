"""The JSON report file (schema 2, documented in docs/json-schema.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import InputError
from bisect_onnx.sources.output_paths import check_report_path

if TYPE_CHECKING:  # types only: records import the report formats to save themselves
    from bisect_onnx.judge.records import Report

__all__ = ["to_json", "write_json"]


def to_json(report: Report) -> str:
    """The report as strict JSON text (non-finite numbers become ``null``)."""
    return json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False)


def write_json(report: Report, path: Path) -> None:
    """Write the report to ``path``, a file the user named."""
    check_report_path(report, path, "--json")
    try:
        Path(path).write_text(to_json(report) + "\n", encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the JSON report to {path}: {error.strerror}; "
                         "choose a writable path for --json") from error


def _finite(data: object) -> object:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_finite(value) for value in data]
    return data
