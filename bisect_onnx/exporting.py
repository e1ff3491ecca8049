"""Export a PyTorch model to ONNX with the dynamo exporter, into a folder we own."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align import CallIndex
from bisect_onnx.errors import ModelError

if TYPE_CHECKING:
    import torch

__all__ = ["ExportResult", "export_dynamo", "call_index_from_program"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    """The exported file and what the exporter knew that the file does not say."""

    path: Path
    call_index: CallIndex
    """Which call of each module every FX node ran in (from ``nn_module_stack``)."""


def export_dynamo(
    model: torch.nn.Module, inputs: Sequence[np.ndarray], folder: Path, *, opset: int | None
) -> ExportResult:
    """Export ``model`` on ``inputs`` with ``torch.onnx.export(dynamo=True)``."""
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(array)) for array in inputs)
    path = folder / "model.onnx"
    logger.info("exporting %s with the dynamo exporter", type(model).__name__)
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                model, args, dynamo=True, opset_version=opset, verbose=False
            )
            program.save(str(path))
    except Exception as error:
        logger.debug("export failed", exc_info=True)
        raise ModelError(f"the dynamo exporter could not export {type(model).__name__}: "
                         f"{_summarize(error)}") from error
    exported = getattr(program, "exported_program", None)
    return ExportResult(path=path, call_index=call_index_from_program(exported))


def call_index_from_program(exported_program: object | None) -> dict[str, dict[str, int]]:
    """Map FX node name -> module path -> call number, from ``nn_module_stack``.

    torch.export keys a module's stack entry ``L__self__relu`` on its first call
    and ``L__self__relu@1`` on the second; the ONNX metadata keeps only the path.
    """
    index: dict[str, dict[str, int]] = {}
    graph = getattr(exported_program, "graph", None)
    if graph is None:
        return index
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        calls = {}
        for key, entry in stack.items():
            path = entry[0] if isinstance(entry, tuple) and entry else None
            if isinstance(path, str):
                _, at, number = key.rpartition("@")
                calls[path] = int(number) if at and number.isdigit() else 0
        if calls:
            index[node.name] = calls
    return index


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Keep the exporter's chatter (optional-package notices, deprecations) out of our output."""
    torch_onnx_logger = logging.getLogger("torch.onnx")
    previous = torch_onnx_logger.level
    torch_onnx_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for warning in caught:
            logger.debug("exporter warning: %s", warning.message)
    finally:
        torch_onnx_logger.setLevel(previous)


def _summarize(error: BaseException) -> str:
    """The exporter's reason in one readable line (its messages run to pages).

    The exporter wraps the real failure (``TorchExportError: Failed to export the
    model with torch.export. This is step 1/3 ...``); the innermost cause says why.
    """
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    for candidate in reversed(chain):
        text = _ANSI.sub("", str(candidate))
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        useful = [line for line in lines if not line.startswith(("[", "#", "-", "="))]
        if useful:
            summary = f"{type(candidate).__name__}: {useful[0]}"
            return summary[:300] + ("…" if len(summary) > 300 else "")
    return type(error).__name__


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
