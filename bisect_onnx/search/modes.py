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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.judge.records import Record, Report, make_record
from bisect_onnx.runtime.memory import estimate_values_bytes, format_size
from bisect_onnx.runtime.onnx_side import OnnxRuntimeSide
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.probes import ProbeBisection, ProbeRunner, checkpoints_for

__all__ = ["MEMORY", "CAPTURE_DIFFERS", "NO_VALUE_FAILS", "FULL_CAPTURE", "over_budget",
           "outputs_differ", "bisect_production", "adopt_bisection",
           "references_by_value"]

logger = logging.getLogger(__name__)

FULL_CAPTURE = {"mode": "full capture"}
MEMORY = ("both sides' values ({need}) would not fit in the memory budget ({budget}): "
          "ONNX Runtime's values were probed a few at a time")
CAPTURE_DIFFERS = ("the capture session does not compute the production session's final "
                   "outputs: the production graph was probed, a few values at a time")
NO_VALUE_FAILS = ("the final outputs diverge but no captured value does: the values "
                  "production fused away were probed too")
MEMORY_NO_OPS = (
    "over the memory budget, values are probed by name, which needs the dynamo "
    "exporter's program (op granularity): only the final outputs were compared; raise "
    "--max-memory, or compare a dynamo export"
)


def over_budget(candidate: OnnxRuntimeSide, arrays: Sequence[np.ndarray],
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


def production_outputs(candidate: OnnxRuntimeSide, capture: Capture,
                       arrays: Sequence[np.ndarray]) -> tuple[list[CapturedValue],
                                                              ProbeRunner | None]:
    """The production session's final outputs for the capture just run.

    With them, the probe runner that computed them where the capture had no production
    session (every value promoted). The verdict is production's, whatever the capture
    session computed.
    """
    if candidate.production_outputs is not None:
        return [replace(value, array=np.asarray(array)) for value, array in
                zip(capture.outputs, candidate.production_outputs, strict=True)], None
    runner = ProbeRunner(candidate, arrays)
    return runner.outputs, runner


def no_value_fails(report: Report) -> bool:
    """The final outputs diverge, and no compared intermediate value does."""
    return any(report.first_divergence is record for record in report.final_outputs)


def outputs_differ(capture_outputs: Sequence[CapturedValue],
                   production_outputs: Sequence[CapturedValue]) -> bool:
    """Whether the capture's final outputs are not bitwise production's."""
    return any(not np.array_equal(np.asarray(ours.array), np.asarray(theirs.array),
                                  equal_nan=True)
               for ours, theirs in zip(capture_outputs, production_outputs, strict=True))


def bisect_production(runner: ProbeRunner, candidate: OnnxRuntimeSide,
                      references: Mapping[str, CapturedValue], *, rtol: float,
                      atol: float) -> ProbeBisection | None:
    """Probe every value with a reference for the first that fails, if there are any."""
    checkpoints = checkpoints_for(candidate, references)
    if not checkpoints:
        return None
    logger.info("bisecting %d checkpoints with probes of the production graph",
                len(checkpoints))
    return runner.bisect(checkpoints, rtol=rtol, atol=atol)


def adopt_bisection(report: Report, bisection: ProbeBisection, reason: str,
                    references: Mapping[str, CapturedValue],
                    order: Mapping[str, int], *,
                    make_row: Callable[[str, CapturedValue], Record] | None = None) -> None:
    """Make the probes' first failing value the first divergence of a full-capture report.

    The table keeps the capture's rows; where a row holds the same value its record
    (with its op-level detail) takes the production kernels' figures, else the probe's
    record joins the table in graph order (``order``: ONNX value -> node position).
    ``make_row`` builds the probed value's record (ONNX value name, probed value),
    where its reference needs converting or a tolerance of its own; by default it is
    compared with ``references`` at the report's tolerance.
    """
    report.search = bisection.describe(reason)
    report.warnings.extend(bisection.warnings())

    def probed_record(name: str) -> Record:
        probed = bisection.capture.values[name]
        if make_row is not None:
            return make_row(name, probed)
        comparison = compare_arrays(references[name].array, probed.array, rtol=report.rtol,
                                    atol=report.atol)
        return make_record(0, Pair(references[name], probed), comparison)

    # Every probed value's row gets the production kernels' figures; a probed value
    # the capture has no row for joins the table in graph order.
    rows = list(report.comparisons)
    for name in bisection.capture.values:
        record = probed_record(name)
        at = next((index for index, row in enumerate(rows) if row.onnx_value == name), None)
        if at is not None:
            rows[at] = replace(rows[at], **{key: getattr(record, key) for key in _FIGURES})
        elif name == bisection.search.first_failing:
            position = order.get(name, len(order))
            rows.insert(next((index for index, row in enumerate(rows)
                              if order.get(row.onnx_value, len(order)) > position),
                             len(rows)), record)
    report.comparisons = [replace(row, index=index) for index, row in enumerate(rows)]
    first = bisection.search.first_failing
    if first is not None:
        report.first_divergence = next(row for row in report.comparisons
                                       if row.onnx_value == first)
        report.note = None
    else:  # no checkpoint fails under production: the first failing final output
        failing = [record for record in report.final_outputs if record.failed]
        report.first_divergence = min(failing, key=lambda record: order.get(
            record.onnx_value, len(order))) if failing else report.first_divergence
        report.note = ("no checkpoint fails under the production kernels: the culprit "
                       "lies after the last one that passes")
    earlier = [row.onnx_value for row in report.comparisons
               if row.failed and row.index < report.first_divergence.index
               and row.onnx_value not in bisection.capture.values] if first else []
    if earlier:
        report.warnings.append(
            f"{len(earlier)} value(s) before the first divergence fail in the capture "
            f"session only ({', '.join(earlier[:5])}{', …' if len(earlier) > 5 else ''}): "
            "its kernels are not production's, and production's probes place the first "
            "divergence later")
    if first is not None and report.nan_origin is not None and (
            report.nan_origin.index < report.first_divergence.index):
        report.nan_origin = None  # seen in the capture session only


_FIGURES = ("shape", "dtype", "candidate_shape", "candidate_dtype", "max_abs_error",
            "max_rel_error", "mismatch_fraction", "min_passing_atol", "nan_mismatch", "status",
            "sqnr_db")


def references_by_value(pairs: Sequence[Pair], ops: Any) -> dict[str, CapturedValue]:
    """PyTorch's value for each ONNX value name: aligned pairs, then ops by FX name."""
    references: dict[str, CapturedValue] = {}
    if ops is not None:
        references.update(ops.values)
    references.update({pair.candidate.name: pair.reference for pair in pairs})
    return references
