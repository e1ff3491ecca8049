"""What a sweep found: one row per shape and input scale tried, as the report holds it.

A sweep (:mod:`bisect_onnx.pipeline.sweep`) runs both sides on inputs made from one
sample at other sizes of the graph's free dimensions and at other scales and signs,
comparing only the final outputs, until one combination fails; that combination is
then bisected as a sample is. These types are what the report keeps of it (JSON key
``sweep``), so they are plain data, read back as they were written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SweepRow", "SweepTable", "PASSED", "FAILED", "REFUSED", "SKIPPED", "shapes_text"]

PASSED = "parity"
FAILED = "diverged"
REFUSED = "refused"
"""The runtime under test refused to run the combination (a shape baked in, often)."""
SKIPPED = "skipped"
"""The reference could not run the combination (a size the model itself does not take)."""


@dataclass(frozen=True)
class SweepRow:
    """One combination tried: the inputs' shapes, the scale of their values, the outcome."""

    shapes: tuple[tuple[int, ...], ...]
    """Every input's shape, in the graph's input order."""
    scale: str
    """How the float inputs were drawn (``N(0,1)``, ``x100 positive``, ...)."""
    max_abs_error: float | None
    """The worst final output's largest ``|candidate - reference|``; ``None`` where no
    figure applies (a shape mismatch, a run refused or skipped)."""
    verdict: str
    """:data:`PASSED`, :data:`FAILED`, :data:`REFUSED` or :data:`SKIPPED`."""
    reason: str | None = None
    """Why a combination was refused or skipped (the side's message, one line)."""

    @property
    def failed(self) -> bool:
        """Whether this combination shows a divergence (out of tolerance, or refused)."""
        return self.verdict in (FAILED, REFUSED)

    def to_dict(self) -> dict[str, Any]:
        """The row as the JSON report writes it (a non-finite error as ``null``)."""
        error = self.max_abs_error
        return {"shapes": [list(shape) for shape in self.shapes], "scale": self.scale,
                "max_abs_error": error if error is not None and math.isfinite(error) else None,
                "verdict": self.verdict, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepRow:
        """The row :meth:`to_dict` wrote, read back."""
        return cls(shapes=tuple(tuple(shape) for shape in data["shapes"]), scale=data["scale"],
                   max_abs_error=data["max_abs_error"], verdict=data["verdict"],
                   reason=data["reason"])


@dataclass(frozen=True)
class SweepTable:
    """Every combination a sweep tried, in order, and which one the report bisected."""

    input_names: tuple[str, ...]
    free_dims: tuple[str, ...]
    """The graph's free dimensions the sweep varied (``x:0`` for one without a name);
    empty where every dimension is fixed (only the sample's shape is tried)."""
    rows: tuple[SweepRow, ...]
    bisected: int | None
    """The index in ``rows`` of the first failing combination, which the report's
    comparison was made on; ``None`` where every combination passed (the report is
    then the sample's own)."""
    note: str | None = None
    """What the sweep could not try, and why (no free dimension, a declared range)."""

    @property
    def failing(self) -> SweepRow | None:
        """The combination the report bisected, if one failed."""
        return self.rows[self.bisected] if self.bisected is not None else None

    def passing_text(self) -> str:
        """``all 13 combinations of the sweep pass``, or how many PyTorch could not run.

        A skipped combination says nothing of the export, so it is not counted as passing.
        """
        skipped = sum(row.verdict == SKIPPED for row in self.rows)
        if not skipped:
            return f"all {len(self.rows)} combinations of the sweep pass"
        return (f"{len(self.rows) - skipped} of {len(self.rows)} combinations of the sweep "
                f"pass, {skipped} skipped (PyTorch could not run them)")

    def verdict_note(self) -> str:
        """What the verdict rests on: the combination bisected, or every one passing."""
        failing = self.failing
        if failing is None:
            if any(row.verdict == SKIPPED for row in self.rows):
                return f"{self.passing_text()}; the report is the sample's"
            return (f"the sweep's {len(self.rows)} combinations of shapes and input scales "
                    "all pass; the report is the sample's")
        said = (f"the sweep's first failing combination ({failing.scale} at "
                f"{shapes_text(self.input_names, failing.shapes)}, {self.bisected + 1} of "
                f"{len(self.rows)} tried) was bisected")
        if self.bisected and failing.shapes == self.rows[0].shapes:
            # The sample's own shapes pass with its values and fail with others.
            said += (" (the sample's shapes with other values: a branch or value the export "
                     "fixed for the sample's values, such as an `if` on a tensor that the "
                     "TorchScript tracer followed one way)")
        return said

    def to_dict(self) -> dict[str, Any]:
        """The sweep as the JSON report writes it (``sweep``)."""
        return {"input_names": list(self.input_names), "free_dims": list(self.free_dims),
                "rows": [row.to_dict() for row in self.rows], "bisected": self.bisected,
                "note": self.note}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepTable:
        """The sweep :meth:`to_dict` wrote, read back."""
        return cls(input_names=tuple(data["input_names"]), free_dims=tuple(data["free_dims"]),
                   rows=tuple(SweepRow.from_dict(row) for row in data["rows"]),
                   bisected=data["bisected"], note=data["note"])


def shapes_text(names: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]) -> str:
    """``x[2,4], mask[2,4]``: each input's shape, for the table and messages."""
    return ", ".join(f"{name}[{','.join(map(str, shape))}]"
                     for name, shape in zip(names, shapes, strict=False))
