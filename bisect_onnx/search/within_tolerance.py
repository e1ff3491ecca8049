"""Where an error that no failing value's node introduces comes in: within tolerance.

A drift (every failing value's node, fed the reference's inputs, agrees with it) has
two causes: rounding that builds up, or an error a node introduces that passes the
tolerance where it is made and grows past it later. An RMSNorm's epsilon off by 5% adds
5e-7 to a variance of 1e-5: within ``atol=1e-5`` there, 2% off after the ``rsqrt``.
The values upstream of the first divergence that pass yet are off beyond rounding (by
more than 1e-4 of their own largest magnitude) are rerun on the reference's inputs;
the first whose node alone reproduces half its error or more is where it comes in.

Said as evidence beside the drift, not as a culprit: no check shows it out of tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.search.local import run_locally

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Record
    from bisect_onnx.judge.tolerances import Tolerance
    from bisect_onnx.runtime.runner import Runner

__all__ = ["entering_within_tolerance", "said_entry"]

#: Off by more than this share of a value's largest magnitude: beyond float32 rounding
#: (about 1e-7 a step, 1e-5 after long sums) by an order of magnitude.
BEYOND_ROUNDING = 1e-4
#: How many passing values upstream of the first divergence are rerun (nearest first).
MOST_RERUN = 16


def entering_within_tolerance(rows: Sequence[Record], first: Record, upstream: frozenset[str],
                              candidate: Runner, *, reference: Mapping[str, np.ndarray],
                              candidate_values: Mapping[str, np.ndarray],
                              graph_inputs: Mapping[str, np.ndarray],
                              tolerance: Tolerance) -> dict[str, Any] | None:
    """The value where the first divergence's error comes in within tolerance, or None.

    ``upstream``: the values the first divergence is computed from.
    """
    scales: dict[str, float] = {}
    suspects = []
    for row in rows:
        if (row.index >= first.index or row.failed or row.onnx_value not in upstream
                or not row.figures.max_abs_error or row.onnx_value not in reference):
            continue
        scale = float(np.max(np.abs(np.asarray(reference[row.onnx_value], dtype=np.float64)),
                             initial=0.0))
        if scale > 0 and row.figures.max_abs_error > BEYOND_ROUNDING * scale:
            scales[row.onnx_value] = scale
            suspects.append(row)
    suspects = suspects[-MOST_RERUN:]
    if not suspects:
        return None
    checks = run_locally(candidate, [row.onnx_value for row in suspects],
                         reference_values=reference, candidate_values=candidate_values,
                         graph_inputs=graph_inputs, tolerance=tolerance)
    for row in suspects:
        local = checks[row.onnx_value].comparison if row.onnx_value in checks else None
        error, scale = row.figures.max_abs_error, scales[row.onnx_value]
        if (local is not None and local.max_abs_error is not None
                and local.max_abs_error >= 0.5 * error
                and local.max_abs_error > BEYOND_ROUNDING * scale):
            return {"value": row.onnx_value, "node": row.onnx_node, "max_abs_error": error,
                    "local_max_abs_error": float(local.max_abs_error), "scale": scale}
    return None


def said_entry(entry: Mapping[str, Any], origin: str | None, fed: str) -> str:
    """The report's sentence for ``entry``: where the error comes in, and how it shows.

    ``origin``: what the value is (op, module and line); ``fed``: what a node is fed.
    """
    where = f" <- {origin}" if origin else ""
    return (f"No failing value's own nodes introduce the error: it comes in within tolerance "
            f"at ONNX node {entry['node']!r}, value {entry['value']!r}{where}, whose node fed "
            f"{fed} is off by {entry['local_max_abs_error']:.2e} on its own against values of "
            f"magnitude {entry['scale']:.2e} (beyond float rounding, within the tolerance), "
            "and the ops after it carry it past the tolerance; a tighter --atol/--rtol makes "
            "it the culprit")
