"""How the text and HTML reports write figures, shapes, source lines and modules."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.graph.provenance import SourceLocation

if TYPE_CHECKING:  # types only: records import this module to format themselves
    from bisect_onnx.judge.records import Record

__all__ = ["format_module", "format_number", "format_record_shape", "format_rounded_up",
           "format_shape", "format_source"]


def format_module(record: Record) -> str:
    """The torch module, or which final output the record is."""
    return record.torch_module if record.torch_module is not None else f"(output {record.index})"


def format_record_shape(record: Record) -> str:
    """The shape, with the ONNX shape beside it when they differ."""
    shape = format_shape(record.shape)
    if record.candidate_shape != record.shape:
        shape += f" vs {format_shape(record.candidate_shape)}"
    return shape


def format_source(location: SourceLocation) -> str:
    """``file:line``, the file relative to the current folder when it lies inside it."""
    path = Path(location.file)
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return f"{path}:{location.line}"


def format_shape(shape: Sequence[int]) -> str:
    """``[1,3,32,32]``."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def format_rounded_up(value: float) -> str:
    """Three significant digits, rounded up: a printed atol that is advised must pass."""
    text = f"{value:.2e}"
    if float(text) < value:
        step = 10.0 ** (int(text.split("e")[1]) - 2)
        text = f"{(math.floor(value / step) + 1) * step:.2e}"
    return text


def format_number(value: float | None) -> str:
    """An error figure in three significant digits (``-`` where it does not apply)."""
    return "-" if value is None else f"{value:.2e}"
