"""A report saved to a file, and a JSON report read back (``Report.save``, ``Report.load``).

Saving picks one of the format writers (JSON, HTML, Model Explorer node data), which
check the path as the CLI's options do; loading reads a JSON report and hands its data
to the report's own reader (``Report.from_dict``), naming the file in any error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.report.html import write_html
from bisect_onnx.report.json import write_json
from bisect_onnx.report.overlay import write_model_explorer
from bisect_onnx.sources.file_kinds import read_head

if TYPE_CHECKING:  # types only: records import this module to save and load themselves
    from bisect_onnx.judge.records import Report

__all__ = ["save_report", "load_report", "FORMATS", "SUFFIXES"]

#: What :meth:`Report.save` writes, by its ``format`` argument.
FORMATS: Mapping[str, Callable[[Report, Path], None]] = {
    "json": write_json, "html": write_html, "model-explorer": write_model_explorer}
#: The format a suffix stands for. Model Explorer's node data is JSON too (any name):
#: it is written only when asked for by name.
SUFFIXES = {".json": "json", ".html": "html", ".htm": "html"}
_EXPECTED = "a JSON report that bisect-onnx --json or Report.save wrote"


def save_report(report: Report, path: str | os.PathLike[str], format: str | None) -> Path:
    """Write ``report`` to ``path`` in ``format`` (``None``: by the suffix); the path."""
    path = Path(path)
    if format is None:
        format = SUFFIXES.get(path.suffix.lower())
        if format is None:
            raise UsageError(f"cannot tell which report to write to {path} from its suffix "
                             f"{path.suffix or '(none)'}: name a .json, .html or .htm file, or "
                             f"pass format={_choices()}")
    writer = FORMATS.get(format)
    if writer is None:
        raise UsageError(f"unknown report format {format!r}; choose {_choices()}")
    writer(report, path)
    return path


def load_report(path: str | os.PathLike[str],
                read: Callable[[Mapping[str, Any]], Report]) -> Report:
    """The JSON report at ``path``, made by ``read`` (``Report.from_dict``) from its data."""
    path = Path(path)
    try:
        read_head(path, 1, label="report file", expected=_EXPECTED)  # missing, a folder...
        data = json.loads(path.read_text(encoding="utf-8"))
    except PermissionError as error:
        raise InputError(f"report file {path} cannot be read ({error.strerror}); check its "
                         "permissions") from error
    except UnicodeDecodeError as error:
        raise InputError(f"report file {path} is not JSON (not UTF-8 text: byte "
                         f"{error.start}); pass {_EXPECTED}") from error
    except json.JSONDecodeError as error:
        raise InputError(f"report file {path} is not JSON ({error.msg} at line {error.lineno} "
                         f"column {error.colno}); pass {_EXPECTED}") from error
    try:
        return read(data)
    except InputError as error:
        raise InputError(f"report file {path}: {error}") from error


def _choices() -> str:
    """The formats, as a message lists them: ``'json', 'html' or 'model-explorer'``."""
    *others, last = (repr(name) for name in FORMATS)
    return f"{', '.join(others)} or {last}"
