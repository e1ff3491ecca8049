"""What every fix search hands back: one change, tried on a copy, with the rerun's figures.

A :class:`FixResult` cannot be made without the figures of a rerun (``after``), so a
fix that was not checked cannot reach a report. Whether it is a fix or only an
improvement is read off those figures, never set by the search that found it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.judge.compare import ArrayComparison, compare_arrays

if TYPE_CHECKING:
    from bisect_onnx.runtime.sides import JsonObject

__all__ = ["FixKind", "OutputFigures", "FixResult", "output_figures"]


class FixKind:
    """The kinds of change a fix search tries (the JSON ``fixes[].kind`` strings)."""

    KEEP_FLOAT32 = "keep in float32"
    LEAVE_UNQUANTIZED = "leave unquantized"
    DISABLE_OPTIMIZER = "disable optimizer"
    LOWER_OPT_LEVEL = "lower optimization level"
    OTHER_EXPORT = "other export"
    EVAL_MODE = "eval mode"
    SYMBOLIC_EXPORT = "symbolic export"
    """An export call that keeps the sizes the file baked in symbolic."""


@dataclass(frozen=True)
class OutputFigures:
    """How far a run's final outputs are from the reference's, under one tolerance."""

    max_abs: float
    """The largest absolute error over every output (inf where NaN/Inf disagree)."""
    max_rel: float
    """The largest relative error over every output (inf where NaN/Inf disagree)."""
    failing_outputs: int
    """How many outputs are out of tolerance (shape, dtype or NaN mismatches included)."""
    outputs: int

    @property
    def passes(self) -> bool:
        """Whether every output is within tolerance."""
        return self.failing_outputs == 0

    def as_dict(self) -> JsonObject:
        """The JSON form (inf written as null)."""
        def number(value: float) -> float | None:
            return value if math.isfinite(value) else None
        return {"max_abs": number(self.max_abs), "max_rel": number(self.max_rel),
                "failing_outputs": self.failing_outputs, "outputs": self.outputs,
                "passes": self.passes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputFigures:
        """The figures :meth:`as_dict` gave, read back from JSON (``null`` is inf)."""
        def number(value: float | None) -> float:
            return math.inf if value is None else value
        return cls(number(data["max_abs"]), number(data["max_rel"]), data["failing_outputs"],
                   data["outputs"])


def output_figures(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], *,
                   rtol: float, atol: float) -> OutputFigures:
    """Compare a run's final outputs with the reference's, output by output.

    A float16/bfloat16 candidate output is compared in the reference's float type: the
    question a fix answers is whether the numbers agree, not whether the types do.
    """
    if len(reference) != len(candidate):
        return OutputFigures(math.inf, math.inf, max(len(reference), len(candidate)),
                             max(len(reference), len(candidate)))
    max_abs = max_rel = 0.0
    failing = 0
    for want, got in zip(reference, candidate, strict=True):
        want, got = np.asarray(want), np.asarray(got)
        if want.dtype.kind == "f" and got.dtype.kind == "f" and want.dtype != got.dtype:
            got = got.astype(want.dtype)
        comparison = compare_arrays(want, got, rtol=rtol, atol=atol)
        failing += not comparison.passed
        max_abs = max(max_abs, _or_inf(comparison.max_abs_error, comparison))
        max_rel = max(max_rel, _or_inf(comparison.max_rel_error, comparison))
    return OutputFigures(max_abs, max_rel, failing, len(reference))


def _or_inf(value: float | None, comparison: ArrayComparison) -> float:
    """An error figure, infinite where the comparison could not give one."""
    if value is None or comparison.nan_mismatch:
        return math.inf if not comparison.passed else 0.0
    return float(value)


@dataclass(frozen=True)
class FixResult:
    """One candidate fix, applied to a copy and rerun.

    ``change`` is the one line a user acts on ("keep these 3 nodes in float32: ...");
    ``details`` holds what a tool takes (``node_block_list``, ``nodes_to_exclude``,
    ``disabled_optimizers``, an export call), JSON-able.
    """

    kind: str
    change: str
    before: OutputFigures
    after: OutputFigures
    details: Mapping[str, object] = field(default_factory=dict)
    fixed_model: bytes | None = field(default=None, repr=False, compare=False)
    """The fixed ONNX model, serialized, where the fix is a model (for ``--write-fixed``).
    Left out of equality, as of the JSON report: the change and its figures are the fix."""
    seconds: float = field(default=0.0, compare=False)
    """Time the search for this fix took, reruns included: a measure of the run, not of
    the fix (two runs of one search find equal fixes)."""

    @property
    def reaches_parity(self) -> bool:
        """Whether the rerun's outputs are all within tolerance: only then is it a fix."""
        return self.after.passes

    @property
    def factor(self) -> float:
        """How many times smaller the worst absolute error became (inf when it became 0)."""
        if self.after.max_abs == 0:
            return math.inf if self.before.max_abs > 0 else 1.0
        return self.before.max_abs / self.after.max_abs

    def as_dict(self) -> dict[str, object]:
        """The JSON form (``fixes[]`` of the report)."""
        factor = self.factor
        return {"kind": self.kind, "change": self.change,
                "reaches_parity": self.reaches_parity,
                "factor": factor if math.isfinite(factor) else None,
                "before": self.before.as_dict(), "after": self.after.as_dict(),
                "details": dict(self.details), "seconds": round(self.seconds, 3)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FixResult:
        """The fix :meth:`as_dict` gave, read back from JSON (no ``fixed_model``)."""
        return cls(data["kind"], data["change"], OutputFigures.from_dict(data["before"]),
                   OutputFigures.from_dict(data["after"]), data["details"],
                   seconds=data["seconds"])
