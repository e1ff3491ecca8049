"""The exporter-culprit fix search: other exports of the model, each checked by a rerun.

:func:`find_export_fix` tries :func:`~bisect_onnx.fixes.exporter_settings.candidate_settings`
in order, each exported afresh and run in ONNX Runtime, and stops at the first that
reaches parity or when its time budget is spent. Only exports that reach parity are
fixes; one that only shrinks the error is kept as an improvement (its factor says by
how much); one that does neither is only logged, in :attr:`ExportFixSearch.attempts`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.fixes.exporter_settings import candidate_settings
from bisect_onnx.fixes.exporter_trials import ExportAttempt, torch_outputs, try_export
from bisect_onnx.fixes.trial import FixKind, FixResult, OutputFigures
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.pytorch.reexport import ExportCall

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_TIME_BUDGET_S", "Baseline", "ExportFixSearch", "find_export_fix"]

logger = logging.getLogger(__name__)

#: Seconds a search may spend exporting; an export of a small model takes about one.
DEFAULT_TIME_BUDGET_S = 120.0


@dataclass(frozen=True)
class ExportFixSearch:
    """What the search found: checked results, and every export it tried."""

    results: tuple[FixResult, ...]
    """Exports that reach parity (fixes) or shrink the error (improvements), in order."""
    attempts: tuple[ExportAttempt, ...]
    before: OutputFigures
    out_of_time: bool = False
    """Whether candidates were left untried because the time budget was spent."""

    @property
    def fixed(self) -> bool:
        """Whether some export reaches parity."""
        return any(result.reaches_parity for result in self.results)

    def summary(self) -> str:
        """One line: how many exports were tried, and the best figure among them."""
        ran = [attempt for attempt in self.attempts if attempt.figures is not None]
        best = min((attempt.figures.max_abs for attempt in ran), default=None)
        tail = "" if best is None else f"; the best leaves max abs {best:.3g}"
        cut = ", the time budget spent" if self.out_of_time else ""
        return (f"{len(self.attempts)} other export(s) tried ({len(ran)} ran{cut}), "
                f"{'one reaches parity' if self.fixed else 'none reaches parity'}{tail}")


@dataclass(frozen=True)
class Baseline:
    """What every other export is measured against, where the run has measured it already."""

    reference_outputs: Sequence[np.ndarray]
    """PyTorch's final outputs on the search's inputs."""
    before: OutputFigures
    """The failing file's figures against them: every result's ``before``."""


def find_export_fix(model: torch.nn.Module, args: Sequence[object],
                    kwargs: Mapping[str, object] | None = None,
                    *, used: ExportCall, tolerance: Tolerance,
                    baseline: Baseline | None = None,
                    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
                    candidates: Sequence[ExportCall] | None = None) -> ExportFixSearch:
    """Try other exports of ``model`` on ``args``/``kwargs``; the checked results.

    ``used``: how the failing file was exported. ``baseline``: PyTorch's final outputs
    and the failing file's figures; where not given, PyTorch is run here and ``used``
    is exported again and measured (and where that export passes, there is nothing to
    fix: no results). ``candidates``: the exports to try (default
    :func:`candidate_settings` of ``used``).
    """
    kwargs = dict(kwargs or {})
    started = time.perf_counter()
    attempts: list[ExportAttempt] = []
    if baseline is None:
        reference_outputs = torch_outputs(model, args, kwargs)
        again = try_export(model, args, kwargs, used, reference_outputs=reference_outputs,
                           rtol=tolerance.rtol, atol=tolerance.atol)
        attempts.append(again)
        if again.figures is None or again.figures.passes:
            why = again.failure or "it passes: nothing to fix"
            logger.info("export fix: the used export %s: %s", used.describe(), why)
            return ExportFixSearch((), tuple(attempts), again.figures or _failed())
        baseline = Baseline(reference_outputs, again.figures)
    results: list[FixResult] = []
    out_of_time = False
    for settings in (candidate_settings(used) if candidates is None else candidates):
        if time.perf_counter() - started > time_budget_s:
            out_of_time = True
            break
        attempt = try_export(model, args, kwargs, settings,
                             reference_outputs=baseline.reference_outputs,
                             rtol=tolerance.rtol, atol=tolerance.atol)
        attempts.append(attempt)
        result = _result(attempt, baseline.before)
        if result is not None:
            results.append(result)
            if result.reaches_parity:
                break
    return ExportFixSearch(tuple(results), tuple(attempts), baseline.before, out_of_time)


def _result(attempt: ExportAttempt, before: OutputFigures) -> FixResult | None:
    """The attempt as a fix or an improvement; ``None`` where it is neither."""
    after = attempt.figures
    if after is None or not (after.passes or after.max_abs < before.max_abs):
        return None
    settings = attempt.settings
    change = f"export with {settings.describe()}"
    details = {"export": settings.as_dict(), "call": settings.call()}
    return FixResult(FixKind.OTHER_EXPORT, change, before, after, details=details,
                     fixed_model=attempt.model_bytes if after.passes else None,
                     seconds=attempt.seconds)


def _failed() -> OutputFigures:
    """The figures of an export that could not be measured at all."""
    return OutputFigures(float("inf"), float("inf"), 1, 1)
