"""The fixes section of the text report: each change with its rerun's figures."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_onnx.fixes.trial import FixResult, OutputFigures
    from bisect_onnx.judge.records import Report

__all__ = ["fixes_section"]


def fixes_section(report: Report) -> str:
    """The fixes a run checked and its notes on fix searches; empty when none was asked.

    A fix is listed only with the figures of the rerun that checked it, so the section
    can say nothing a run did not measure.
    """
    if not report.fixes and not report.fix_notes:
        return ""
    lines = ["fixes (each applied to a copy and checked by a rerun):"]
    for fix in sorted(report.fixes, key=lambda each: not each.reaches_parity):
        lines.append(f"  {_standing(fix)}: {fix.change}")
        lines.append(f"    final outputs: {_figures(fix.before)} -> {_figures(fix.after)}")
    lines.extend(f"  {note}" for note in report.fix_notes)
    return "\n".join(lines)


def _standing(fix: FixResult) -> str:
    if fix.reaches_parity:
        return "FIX, reaches parity"
    factor = fix.factor
    return ("only improves it, error x1/" + (f"{factor:.3g}" if math.isfinite(factor) else "inf"))


def _figures(figures: OutputFigures) -> str:
    return (f"max abs {figures.max_abs:.2e}, {figures.failing_outputs} of {figures.outputs} "
            "outputs out of tolerance")
