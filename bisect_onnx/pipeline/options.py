"""The options of a run, each object checking itself once for every caller.

The CLI, the Python API and the pytest plugin build the same objects, so a bad value
gets the same one-line error whichever way it came in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_onnx.errors import UsageError
from bisect_onnx.runtime.memory import default_budget, parse_size
from bisect_onnx.runtime.sessions import CPU_PROVIDER, DEFAULT_OPT_LEVEL, check_runtime

__all__ = ["ExportOptions", "RuntimeOptions", "RandomInputs"]


@dataclass(frozen=True)
class ExportOptions:
    """How bisect-onnx exports the model when no ONNX model is given."""

    exporter: str | None = None
    """``dynamo`` (torch's default) or ``torchscript`` (``dynamo=False``); ``None``
    picks dynamo, or torchscript for a TorchScript model, which dynamo cannot take."""
    opset: int | None = None
    dynamic_batch: bool = False
    """Export dimension 0 of every input as dynamic."""
    save_to: str | Path | None = None
    """Keep a copy of the export there."""
    torch_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """More keywords for ``torch.onnx.export`` (``custom_translation_table``, ...)."""


@dataclass(frozen=True)
class RuntimeOptions:
    """How ONNX Runtime runs the ONNX model under test."""

    provider: str = CPU_PROVIDER
    opt_level: str = DEFAULT_OPT_LEVEL
    """``disabled``, ``basic``, ``extended`` or ``all`` (ONNX Runtime's default)."""
    promote: str = "fused"
    """``fused``: promote only the values that survive ORT's optimizations, so the
    capture runs the production kernels (checked); ``all``: every node output."""
    max_memory: int | str | None = None
    """Memory the captured values of both sides may take (bytes, or ``"2GB"``); over
    it, values are probed a few at a time. ``None``: most of the memory available."""

    def check(self) -> None:
        """One-line errors for settings that cannot work, before anything is exported."""
        check_runtime(self.provider, self.opt_level, self.promote)
        if self.max_memory is not None:
            parse_size(self.max_memory)

    def budget(self) -> int | None:
        """The memory budget in bytes; ask once the model is loaded (it takes memory)."""
        if self.max_memory is None:
            return default_budget()
        return parse_size(self.max_memory)

    def session_keywords(self) -> dict[str, str]:
        """What :class:`~bisect_onnx.runtime.onnx_side.OnnxRuntimeSide` takes of these."""
        return {"provider": self.provider, "opt_level": self.opt_level,
                "promote": self.promote}


@dataclass(frozen=True)
class RandomInputs:
    """Inputs drawn from the ONNX graph's input specification, when none are given."""

    seed: int = 0
    dims: Mapping[str, int] = field(default_factory=dict)
    """Values of the graph's named free dimensions (``{"sequence": 128}``)."""
    samples: int = 1
    """How many inputs to try; the report is the worst one's."""

    def __post_init__(self) -> None:
        samples = self.samples
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise UsageError(f"samples must be a whole number >= 1, got {samples!r}")

    def check_unused(self, inputs: Any) -> None:
        """Refuse random-input settings alongside given inputs, which they cannot change."""
        if inputs is not None and self != RandomInputs():
            raise UsageError("seed, dims and samples (--seed, --dim, --samples) apply to "
                             "random inputs: drop them, or drop the given inputs")
