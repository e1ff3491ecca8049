"""Which search finds the first divergence: a full capture, or bisection by probes.

A full capture (every value the production graph keeps, promoted in one session) is
the default: one run shows every value. Bisection by probes
(:mod:`bisect_onnx.search.probes`) takes over when the full capture cannot be trusted or
afforded:

- ``memory``: both sides' values would not fit in the memory budget; only one side
  (PyTorch's) is held, and ONNX Runtime's values are fetched a few at a time;
- ``capture differs``: the capture session does not compute the production session's
  final outputs (other kernels: a promoted value broke a fusion, another layout), so
  a bug only production's kernels have may be invisible to it;
- ``no value fails``: the final outputs diverge but no captured value does; the
  values production fused away are probed too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.judge.findings import FINAL_OUTPUTS, RowRef, SearchFindings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.runtime.memory import estimate_values_bytes, format_size
from bisect_onnx.runtime.runner import Runner, RuntimeRun
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.probes import ProbeBisection, ProbeRunner, checkpoints_for

if TYPE_CHECKING:
    from bisect_onnx.graph.view import GraphView
    from bisect_onnx.pytorch.op_values import OpCapture

__all__ = ["MEMORY", "CAPTURE_DIFFERS", "NO_VALUE_FAILS", "FULL_CAPTURE", "over_budget",
           "outputs_differ", "tolerance_share", "FAITHFUL_SHARE", "bisect_production",
           "adopt_bisection", "references_by_value", "capture_suspects"]

logger = logging.getLogger(__name__)

FULL_CAPTURE = {"mode": "full capture"}
MEMORY = ("both sides' values ({need}) would not fit in the memory budget ({budget}): "
          "production's values were probed a few at a time")
CAPTURE_DIFFERS = ("the capture session does not compute the production session's final "
                   "outputs: the production graph was probed, a few values at a time")
NO_VALUE_FAILS = ("the final outputs diverge but no captured value does: the values "
                  "production fused away were probed too")
#: The share of the tolerance under which a capture's final outputs count as
#: production's: every output element the capture shows is production's to within a
#: tenth of the tolerance, so a divergence production computes shows in the capture at
#: nine tenths of its size or more. Another layout's rounding on x86 (NCHWc off) uses
#: 1-3% on clean CNNs (Hugging Face ResNet, ViT); a planted edit uses many times 100%.
FAITHFUL_SHARE = 0.1
MEMORY_NO_OPS = (
    "over the memory budget, values are probed by name, which needs the dynamo "
    "exporter's program (op granularity): only the final outputs were compared; raise "
    "--max-memory, or compare a dynamo export"
)


def over_budget(candidate: Runner, arrays: Sequence[np.ndarray],
                budget: int | None) -> str | None:
    """The reason to probe instead of capturing, when both sides would not fit."""
    if budget is None:
        return None
    one_side = estimate_values_bytes(candidate.model, arrays)
    if one_side is None:
        logger.info("shape inference gives no value's size: the memory budget cannot be "
                    "applied, and every value is captured")
        return None
    logger.info("a full capture holds about %s per side (budget %s)", format_size(one_side),
                format_size(budget))
    if 2 * one_side <= budget:
        return None
    return MEMORY.format(need=format_size(2 * one_side), budget=format_size(budget))


def production_outputs(candidate: Runner, ran: RuntimeRun,
                       arrays: Sequence[np.ndarray]) -> tuple[list[CapturedValue],
                                                              ProbeRunner | None]:
    """The production session's final outputs for the capture just run.

    With them, the probe runner that computed them where the capture had no production
    session (every value promoted). The verdict is production's, whatever the capture
    session computed.
    """
    if ran.production.outputs is not None:
        return [replace(value, array=np.asarray(array)) for value, array in
                zip(ran.capture.outputs, ran.production.outputs, strict=True)], None
    runner = ProbeRunner(candidate, arrays)
    return runner.outputs, runner


def no_value_fails(report: Reading) -> bool:
    """The final outputs diverge, and no compared intermediate value does."""
    return report.first_divergence_ref is not None and (
        report.first_divergence_ref.table == FINAL_OUTPUTS)


def outputs_differ(capture_outputs: Sequence[CapturedValue],
                   production_outputs: Sequence[CapturedValue], *,
                   rtol: float | None = None, atol: float | None = None) -> bool:
    """Whether the capture's final outputs are not production's, as far as it matters.

    With a tolerance, they differ where some element differs by more than
    :data:`FAITHFUL_SHARE` of it (:func:`tolerance_share`): a capture under other
    kernels (NCHWc layout off) rounds otherwise by ~1e-6, which no verdict can see,
    and its captured values stand. Without one, bitwise.
    """
    if rtol is None or atol is None:
        return any(not np.array_equal(np.asarray(ours.array), np.asarray(theirs.array),
                                      equal_nan=True)
                   for ours, theirs in zip(capture_outputs, production_outputs,
                                           strict=True))
    return tolerance_share(capture_outputs, production_outputs, rtol=rtol,
                           atol=atol) > FAITHFUL_SHARE


def tolerance_share(capture_outputs: Sequence[CapturedValue],
                    production_outputs: Sequence[CapturedValue], *, rtol: float,
                    atol: float) -> float:
    """How much of the tolerance the capture's outputs use, at their worst element.

    The largest ``|capture - production| / (atol + rtol * |production|)``, the
    comparison's own criterion with production as the reference: 0 where they are
    bitwise equal, 1 where an element would just pass, ``inf`` for another shape or
    dtype, a NaN or infinity on one side only.
    """
    worst = 0.0
    for ours, theirs in zip(capture_outputs, production_outputs, strict=True):
        got, expected = np.asarray(ours.array), np.asarray(theirs.array)
        if np.array_equal(got, expected, equal_nan=True):
            continue
        if got.shape != expected.shape or got.dtype != expected.dtype or (
                got.dtype.kind != "f"):
            return math.inf
        got, expected = got.astype(np.float64), expected.astype(np.float64)
        finite = np.isfinite(got) & np.isfinite(expected)
        if not np.array_equal(got[~finite], expected[~finite], equal_nan=True):
            return math.inf
        difference = np.abs(got[finite] - expected[finite])
        allowed = atol + rtol * np.abs(expected[finite])
        if np.any((allowed == 0) & (difference > 0)):
            return math.inf
        shares = difference / np.where(allowed > 0, allowed, 1.0)
        worst = max(worst, float(shares.max(initial=0.0)))
    return worst


def bisect_production(runner: ProbeRunner, candidate: Runner,
                      references: Mapping[str, CapturedValue], *, rtol: float,
                      atol: float, suspects: Sequence[str] = (),
                      memory_budget: int | None = None) -> ProbeBisection | None:
    """Probe every value with a reference for the first that fails, if there are any.

    ``suspects``: values the capture session saw fail, probed first
    (:meth:`ProbeRunner.bisect`); ``memory_budget`` bounds the values one probe marks.
    """
    checkpoints = checkpoints_for(candidate, references)
    if not checkpoints:
        return None
    logger.info("bisecting %d checkpoints with probes of the production graph",
                len(checkpoints))
    return runner.bisect(checkpoints, rtol=rtol, atol=atol, suspects=suspects,
                         memory_budget=memory_budget)


def adopt_bisection(report: Reading, bisection: ProbeBisection, reason: str,
                    references: Mapping[str, CapturedValue],
                    view: GraphView, *,
                    make_row: Callable[[str, CapturedValue], Record] | None = None,
                    ) -> SearchFindings:
    """The comparison as production's probes show it: their first failing value first.

    The table keeps the capture's rows; where a row holds the same value its record
    (with its op-level detail) takes the production kernels' figures, else the probe's
    record joins the table in graph order (``view``: the candidate's graph).
    ``make_row`` builds the probed value's record (ONNX value name, probed value),
    where its reference needs converting or a tolerance of its own; by default it is
    compared with ``references`` at the report's tolerance.
    """
    comparison = report.findings.judged

    def probed_record(name: str) -> Record:
        probed = bisection.capture.values[name]
        if make_row is not None:
            return make_row(name, probed)
        result = compare_arrays(references[name].array, probed.array, rtol=comparison.rtol,
                                atol=comparison.atol)
        return make_record(0, Pair(references[name], probed), result)

    # Every probed value's row gets the production kernels' figures; a probed value
    # the capture has no row for joins the table in graph order.
    rows = list(comparison.comparisons)
    failed_in_capture = {row.onnx_value for row in rows if row.failed}
    for name in bisection.capture.values:
        record = probed_record(name)
        at = next((index for index, row in enumerate(rows) if row.onnx_value == name), None)
        if at is not None:
            kept = rows[at].figures  # judged by the row's own tolerance still
            rows[at] = replace(rows[at], **{key: getattr(record, key) for key in _FIGURES},
                               figures=replace(record.figures, rtol=kept.rtol, atol=kept.atol))
        elif name == bisection.search.first_failing:
            position = view.position(name)
            rows.insert(next((index for index, row in enumerate(rows)
                              if view.position(row.onnx_value) > position),
                             len(rows)), record)
    rows = [replace(row, index=index) for index, row in enumerate(rows)]
    first = bisection.search.first_failing
    nan_origin = comparison.nan_origin
    if first is not None:
        first_ref, note = _first_ref(first, rows, comparison.final_outputs), None
        first_index = _first_failing_index(rows, first)
        nan_index = (_first_failing_index(rows, nan_origin.value)
                     if nan_origin is not None else None)
        if nan_index is not None and first_index is not None and nan_index < first_index:
            nan_origin = None  # seen in the capture session only
    else:  # no checkpoint fails under production: the first failing final output
        failing = [record for record in comparison.final_outputs if record.failed]
        first_ref = (RowRef(min(failing, key=lambda record: view.position(
            record.onnx_value)).onnx_value, FINAL_OUTPUTS) if failing
            else comparison.first_divergence)
        first_index = None
        note = ("no checkpoint fails under the production kernels: the culprit "
                "lies after the last one that passes")
    warnings = [*comparison.warnings, *bisection.warnings(),
                *_capture_only_failures(rows, first_index, bisection, failed_in_capture)]
    return SearchFindings(bisection.describe(reason), replace(
        comparison, comparisons=tuple(rows), first_divergence=first_ref, note=note,
        nan_origin=nan_origin, warnings=tuple(warnings)))


def _first_ref(first: str, rows: Sequence[Record], final_outputs: Sequence[Record]) -> RowRef:
    """The first failing value's row: in the table, else the final output it is.

    A final output the probes found failing first may have no failing row of its own:
    none where it was not probed (production's run gave it; a shape baked into the
    export made it the wrong shape), a passing one where the table paired it with
    another op than the model's output (a loop the export unrolled fewer times, its
    partial sum). Its final-output row, failing, is then the first divergence.
    """
    row = next((row for row in rows if row.onnx_value == first), None)
    if (row is None or not row.failed) and any(
            output.onnx_value == first and output.failed for output in final_outputs):
        return RowRef(first, FINAL_OUTPUTS)
    return RowRef(first)


def _first_failing_index(rows: Sequence[Record], value: str) -> int | None:
    return next((row.index for row in rows if row.onnx_value == value and row.failed),
                next((row.index for row in rows if row.onnx_value == value), None))


def _capture_only_failures(rows: Sequence[Record], first_index: int | None,
                           bisection: ProbeBisection,
                           failed_in_capture: set[str]) -> list[str]:
    """What to say of values that fail in the capture but were not named."""
    warnings = []
    passed = [row.onnx_value for row in rows
              if row.onnx_value in failed_in_capture and row.onnx_value
              in bisection.capture.values and not row.failed]
    if passed:
        warnings.append(
            f"{len(passed)} value(s) that fail in the capture session pass under the "
            f"production kernels ({_listed(passed)}): the capture's kernels are not "
            "production's")
    if bisection.search.first_failing is None or first_index is None:
        return warnings
    unprobed = [row.onnx_value for row in rows
                if row.failed and row.index < first_index
                and row.onnx_value not in bisection.capture.values]
    if unprobed:
        warnings.append(
            f"{len(unprobed)} value(s) before the first divergence fail in the capture "
            f"session and were not probed in production ({_listed(unprobed)}): the first "
            "divergence is not computed from them, or from them only through a value "
            "that passes under the production kernels")
    return warnings


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (", …" if len(names) > 5 else "")


def capture_suspects(report: Reading) -> list[str]:
    """The ONNX values that fail in a full capture's report, for the probes to try first."""
    return [row.onnx_value for row in report.comparisons if row.failed and row.onnx_value]


_FIGURES = ("shape", "dtype", "candidate_shape", "candidate_dtype")


def references_by_value(pairs: Sequence[Pair], ops: OpCapture | None) -> dict[str, CapturedValue]:
    """PyTorch's value for each ONNX value name: aligned pairs, then ops by FX name."""
    references: dict[str, CapturedValue] = {}
    if ops is not None:
        references.update(ops.values)
    references.update({pair.candidate.name: pair.reference for pair in pairs})
    return references
