"""Which search finds the first divergence: a full capture, or bisection by probes.

A full capture (every value the production graph keeps, promoted in one session) is
the default: one run shows every value. Bisection by probes
(:mod:`bisect_onnx.probes`) takes over when the full capture cannot be trusted or
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

from bisect_onnx.align import Pair
from bisect_onnx.compare import compare_arrays
from bisect_onnx.memory import estimate_values_bytes, format_size
from bisect_onnx.onnx_side import OnnxRuntimeSide
from bisect_onnx.probes import ProbeBisection, ProbeRunner, checkpoints_for
from bisect_onnx.records import Record, Report, make_record
from bisect_onnx.sides import CapturedValue

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
    logger.info("a full capture holds about %s per side (budget %s)", format_size(one_side),
                format_size(budget))
    if 2 * one_side <= budget:
        return None
    return MEMORY.format(need=format_size(2 * one_side), budget=format_size(budget))


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
    first = bisection.search.first_failing
    if first is None:
        return
    probed = bisection.capture.values[first]
    if make_row is not None:
        record = make_row(first, probed)
    else:
        comparison = compare_arrays(references[first].array, probed.array, rtol=report.rtol,
                                    atol=report.atol)
        record = make_record(0, Pair(references[first], probed), comparison)
    rows = list(report.comparisons)
    at = next((index for index, row in enumerate(rows) if row.onnx_value == first), None)
    if at is not None:  # the capture's row, with the production kernels' figures
        rows[at] = replace(rows[at], **{key: getattr(record, key) for key in _FIGURES})
    else:
        position = order.get(first, len(order))
        at = next((index for index, row in enumerate(rows)
                   if order.get(row.onnx_value, len(order)) > position), len(rows))
        rows.insert(at, record)
    report.comparisons = [replace(row, index=index) for index, row in enumerate(rows)]
    report.first_divergence = report.comparisons[at]
    report.note = None


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
