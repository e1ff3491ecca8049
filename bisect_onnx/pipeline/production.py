"""The ONNX model under test as production runs it: capture, production's outputs, probes.

Both comparison modes run their candidate through here, so the verdict is always
production's, a capture that may not show what production computes is always probed
the same way, and the report describes the capture the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bisect_onnx.judge.compare import ArrayComparison
from bisect_onnx.judge.findings import SearchFindings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.judge.vocabulary import ReportWarning
from bisect_onnx.pipeline.torch_comparison import NOTHING_ALIGNED
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.runner import ProductionCheck, Runner
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search import modes
from bisect_onnx.search.probes import Checkpoint, ProbeBisection, ProbeRunner

__all__ = ["CandidateRun", "run_candidate", "probe_production", "capture_warning",
           "memory_bisection", "nothing_fetched", "wants_probes",
           "CAPTURE_DIFFERS_WARNING", "CAPTURE_FELL_BACK"]

logger = logging.getLogger(__name__)

CAPTURE_DIFFERS_WARNING = ReportWarning(
    "capture-differs",
    "the capture session ({mode}) computes final outputs that differ from the production "
    "session's by up to {difference}{share} (other kernels, other rounding): a divergence "
    "only the production kernels show may be missed"
)
CAPTURE_FELL_BACK = ReportWarning(
    "capture-fell-back",
    "only {survivors} of {values} candidate values survive ONNX Runtime's optimized graph "
    "(float16 nodes run through inserted Casts, QDQ pairs fused into QLinear kernels): "
    "every value was promoted instead, which changes what ONNX Runtime fuses")

MEMORY_PARITY = ReportWarning(
    "memory-parity",
    "over the memory budget, only production's final outputs were computed; they agree, "
    "and values are probed only to locate a divergence (hidden divergences under agreeing "
    "outputs were not looked for)")

#: Below this share of values surviving ONNX Runtime's optimized graph, fusion-preserving
#: capture says little (float16 nodes run through Casts ONNX Runtime inserts on CPU, QDQ
#: pairs fused into QLinear kernels): every value is promoted instead.
SURVIVAL_FLOOR = 0.5


@dataclass
class CandidateRun:
    """The runtime's side of one sample: the capture, and production's final outputs.

    ``production_check``: how the capture was checked against production (``None``
    over the memory budget, where nothing is captured).
    """

    side: Runner
    """The runner that captured (a promote-all one after a fallback)."""
    capture: Capture
    production: list[CapturedValue]
    """The production session's final outputs: the verdict is theirs."""
    production_check: ProductionCheck | None
    runner: ProbeRunner | None = None
    """Probes of production, where one was needed already."""
    capture_differs: bool = False
    """The capture session's final outputs are not bitwise production's."""
    fallback: str | None = None
    """Why every value was promoted instead of those production keeps, if it was."""

    def tolerance_used(self, rtol: float, atol: float) -> float:
        """How much of the tolerance the capture's final outputs use against production's.

        0 where they are bitwise production's (:func:`bisect_onnx.search.modes.tolerance_share`).
        """
        if not self.capture_differs:
            return 0.0
        return modes.tolerance_share(self.capture.outputs, self.production, rtol=rtol,
                                     atol=atol)

    def capture_matters(self, tolerance: Tolerance) -> bool:
        """Whether the capture's outputs differ from production's by enough to matter.

        Under :data:`~bisect_onnx.search.modes.FAITHFUL_SHARE` of the run's base
        ``tolerance`` the captured values stand (another layout's rounding), and nothing
        is probed.
        """
        return self.tolerance_used(tolerance.rtol, tolerance.atol) > modes.FAITHFUL_SHARE

    def judged_capture(self) -> Capture:
        """The captured values with production's final outputs: what the verdict judges."""
        return Capture(values=self.capture.values, outputs=self.production)


def run_candidate(candidate: Runner, arrays: Sequence[np.ndarray], *,
                  memory_reason: str | None = None,
                  fall_back: bool = False) -> CandidateRun:
    """Capture the candidate's values and production's final outputs for one sample.

    ``memory_reason``: over the memory budget, only production's outputs are computed
    now and its values are probed later. ``fall_back``: promote every value when too
    few survive production's optimized graph (a converted candidate, float16 or QDQ).
    """
    if memory_reason:
        runner = ProbeRunner(candidate, arrays)
        return CandidateRun(candidate, Capture(values={}, outputs=runner.outputs),
                            runner.outputs, None, runner)
    fallback = None
    survival = candidate.survival() if fall_back else None
    if survival is not None and survival[0] < SURVIVAL_FLOOR * survival[1]:
        candidate = candidate.with_promotion("all")
        fallback = CAPTURE_FELL_BACK.format(survivors=survival[0], values=survival[1])
    logger.info("running %s and capturing its values", display_name(candidate.runtime))
    ran = candidate.run(arrays)
    production, runner = modes.production_outputs(candidate, ran, arrays)
    return CandidateRun(candidate, ran.capture, production, ran.production, runner,
                        capture_differs=modes.outputs_differ(ran.capture.outputs, production),
                        fallback=fallback)


def probe_production(report: Reading, run: CandidateRun, arrays: Sequence[np.ndarray],
                     checkpoints: Sequence[Checkpoint], *, tolerance: Tolerance,
                     compare: Callable[[Checkpoint, np.ndarray], ArrayComparison] | None = None,
                     make_row: Callable[[str, CapturedValue], Record] | None = None,
                     ) -> tuple[ProbeBisection, SearchFindings] | None:
    """Bisect production when the capture may not show what it computes.

    Called when the report diverged and either the capture's outputs are not
    production's or no captured value fails. The probes' first failing value is the
    first divergence of the comparison returned. ``compare`` and ``make_row`` judge a
    probed value where its reference needs converting or a tolerance of its own.
    """
    if not checkpoints:
        return None
    candidate = run.side
    run.runner = run.runner or ProbeRunner(candidate, arrays)
    logger.info("bisecting %d checkpoints with probes of the production graph",
                len(checkpoints))
    # What the capture saw fail is probed first: evidence is never thrown away.
    bisection = run.runner.bisect(checkpoints, rtol=tolerance.rtol, atol=tolerance.atol,
                                  compare=compare, suspects=modes.capture_suspects(report))
    reason = (modes.CAPTURE_DIFFERS if run.capture_matters(tolerance)
              else modes.NO_VALUE_FAILS)
    search = modes.adopt_bisection(
        report, bisection, reason,
        {checkpoint.name: checkpoint.reference for checkpoint in checkpoints},
        candidate.view,
        make_row=make_row)
    return bisection, search


def wants_probes(report: Reading, run: CandidateRun, tolerance: Tolerance) -> bool:
    """Whether the capture may not show the first divergence production computes."""
    return report.diverged and (run.capture_matters(tolerance)
                                or modes.no_value_fails(report))


def capture_warning(production: ProductionCheck | None, capture: dict, *,
                    share: float | None = None) -> str | None:
    """The warning that the capture session computes other outputs than production.

    ``share``: how much of the tolerance the difference uses
    (:meth:`CandidateRun.tolerance_used`); under
    :data:`~bisect_onnx.search.modes.FAITHFUL_SHARE` nothing is said. Without it, any
    difference is.
    """
    if production is None or production.matches is not False:
        return None
    if share is not None and share <= modes.FAITHFUL_SHARE:
        return None
    used = "" if share is None else (
        ", more than the tolerance" if share > 1 else f", {share:.0%} of the tolerance")
    return CAPTURE_DIFFERS_WARNING.format(difference=production.difference,
                                          mode=capture.get("mode"), share=used)


def memory_bisection(report: Reading, bisection: ProbeBisection,
                     memory_reason: str) -> SearchFindings:
    """Over the budget, the probes found the values compared: say so.

    Alignment saw only the probed values, and took every other one for a value ONNX
    Runtime fused into a kernel; production does compute them.
    """
    comparison = report.findings.judged
    unaligned = tuple(
        replace(item, kind="not-probed", reason="not probed: over the memory budget, values "
                "are fetched only to locate the divergence")
        if item.kind == "runtime-fused" else item for item in comparison.unaligned)
    return SearchFindings(bisection.describe(memory_reason), replace(
        comparison, unaligned=unaligned,
        warnings=(*comparison.warnings, *bisection.warnings())))


def nothing_fetched(report: Reading, memory_reason: str) -> SearchFindings:
    """Over the budget with nothing probed: say so, not that nothing aligned."""
    comparison = report.findings.judged
    warnings = [warning for warning in comparison.warnings
                if getattr(warning, "code", None) != NOTHING_ALIGNED.code]
    if not report.diverged:
        warnings.append(MEMORY_PARITY)
    return SearchFindings(  # nothing was fetched: nothing is unaligned either
        {"mode": "final outputs only", "reason": memory_reason},
        replace(comparison, warnings=tuple(warnings), unaligned=(), onnx_unaligned=()))
