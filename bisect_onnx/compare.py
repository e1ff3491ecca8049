"""The one place where two arrays are judged equal or not.

Every tolerance rule of bisect-onnx lives in :func:`compare_arrays`: how NaN and Inf
are matched, how integers and booleans are compared, what the relative error of a
zero reference is. Table, JSON and verdict all read the :class:`ArrayComparison` it
returns; nothing else recomputes an error.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from bisect_onnx.errors import UsageError

__all__ = ["ArrayComparison", "Status", "compare_arrays", "check_tolerances"]

# Defaults chosen for float32 models: float32 has ~7 significant digits, and a few
# hundred accumulated roundings (a deep conv stack) cost about three of them.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-5


class Status:
    """The status strings of a comparison (the JSON ``status`` field)."""

    PASS = "pass"
    FAIL = "fail"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    NAN_MISMATCH = "nan_mismatch"


@dataclass(frozen=True)
class ArrayComparison:
    """Error figures of a candidate array against a reference array.

    ``max_rel_error`` ignores elements whose reference is exactly zero (their
    relative error is undefined; ``max_abs_error`` covers them). ``min_passing_atol``
    is the smallest atol that would pass with the same rtol, ``None`` when no atol
    can (NaN/Inf in different places, shape or dtype mismatch, integer mismatch).
    """

    status: str
    shape: tuple[int, ...]
    dtype: str
    candidate_shape: tuple[int, ...]
    candidate_dtype: str
    max_abs_error: float | None
    max_rel_error: float | None
    mismatch_fraction: float | None
    min_passing_atol: float | None
    nan_mismatch: int

    @property
    def passed(self) -> bool:
        """Whether the candidate is within tolerance of the reference."""
        return self.status == Status.PASS


def check_tolerances(rtol: float, atol: float) -> None:
    """Refuse tolerances that cannot mean anything (negative, NaN, infinite)."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        # numbers.Real admits numpy scalars (np.float32(1e-3)) as well as int and float.
        if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                or not math.isfinite(value) or value < 0):
            raise UsageError(
                f"{name} must be a finite number >= 0, got {value!r}; "
                f"for example --{name} {DEFAULT_RTOL if name == 'rtol' else DEFAULT_ATOL}"
            )


def compare_arrays(
    reference: np.ndarray, candidate: np.ndarray, *, rtol: float, atol: float
) -> ArrayComparison:
    """Compare ``candidate`` with ``reference`` elementwise.

    An element fails when ``|candidate - reference| > atol + rtol * |reference|``.
    NaN against NaN and Inf against an Inf of the same sign agree; any other pairing
    with a non-finite value is a NaN/Inf mismatch. Integers and booleans compare
    exactly. Shapes and dtypes must match exactly.
    """
    reference = np.asarray(reference)
    candidate = np.asarray(candidate)

    def result(status: str, **figures: Any) -> ArrayComparison:
        return ArrayComparison(
            status=status,
            shape=tuple(reference.shape),
            dtype=str(reference.dtype),
            candidate_shape=tuple(candidate.shape),
            candidate_dtype=str(candidate.dtype),
            max_abs_error=figures.get("max_abs_error"),
            max_rel_error=figures.get("max_rel_error"),
            mismatch_fraction=figures.get("mismatch_fraction"),
            min_passing_atol=figures.get("min_passing_atol"),
            nan_mismatch=int(figures.get("nan_mismatch") or 0),
        )

    if reference.shape != candidate.shape:
        return result(Status.SHAPE_MISMATCH)
    if reference.dtype != candidate.dtype:
        return result(Status.DTYPE_MISMATCH)
    if reference.size == 0:
        return result(Status.PASS, max_abs_error=0.0, max_rel_error=0.0, mismatch_fraction=0.0,
                      min_passing_atol=0.0)

    if not np.issubdtype(reference.dtype, np.inexact):
        # Integers and booleans: exact equality. The error figures are computed with
        # Python integers on the mismatched elements only, so that int64 values past
        # 2**53 (where float64 loses the units digit) still show their difference.
        unequal = reference != candidate
        mismatched = int(np.count_nonzero(unequal))
        if not mismatched:
            return result(Status.PASS, max_abs_error=0.0, max_rel_error=0.0,
                          mismatch_fraction=0.0, min_passing_atol=0.0)
        ref = reference[unequal].astype(object)
        diff = np.abs(candidate[unequal].astype(object) - ref)
        magnitude = np.abs(ref)
        nonzero = magnitude != 0
        return result(
            Status.FAIL,
            max_abs_error=float(diff.max()),
            max_rel_error=float((diff[nonzero] / magnitude[nonzero]).max()) if nonzero.any()
            else 0.0,
            mismatch_fraction=mismatched / reference.size,
            min_passing_atol=None,
        )

    # Complex numbers are judged by their modulus of difference, like numpy.allclose.
    ref = reference.astype(np.complex128 if np.iscomplexobj(reference) else np.float64)
    cand = candidate.astype(ref.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        difference = cand - ref
    if np.isfinite(difference).all():
        # The usual case, and the one that must be fast: every value finite on both
        # sides (a NaN or Inf on either would make the difference non-finite).
        return result(**_finite_figures(np.abs(difference), np.abs(ref), reference.size,
                                        rtol=rtol, atol=atol))
    ref_finite = np.isfinite(ref)
    cand_finite = np.isfinite(cand)
    both_finite = ref_finite & cand_finite
    # Non-finite positions agree only when both sides hold the same non-finite value.
    same_nonfinite = ~ref_finite & ~cand_finite & (
        (np.isnan(ref) & np.isnan(cand)) | (ref == cand)
    )
    nan_mismatch = int(np.count_nonzero(~both_finite & ~same_nonfinite))

    # Only finite pairs enter the arithmetic: inf - inf would warn and mean nothing.
    # Two huge finite values of opposite sign can still overflow to inf: that is a
    # failure, and not worth a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        figures = _finite_figures(np.abs(cand[both_finite] - ref[both_finite]),
                                  np.abs(ref[both_finite]), reference.size,
                                  rtol=rtol, atol=atol, nan_mismatch=nan_mismatch)
    return result(**figures)


def _finite_figures(diff: np.ndarray, magnitude: np.ndarray, size: int, *, rtol: float,
                    atol: float, nan_mismatch: int = 0) -> dict[str, Any]:
    """Status and figures from the finite pairs' ``|difference|`` and ``|reference|``."""
    # A 0-d pair (a scalar output) would turn into numpy scalars below, not arrays.
    diff, magnitude = np.atleast_1d(diff), np.atleast_1d(magnitude)
    with np.errstate(over="ignore", invalid="ignore"):
        slack = diff - rtol * magnitude  # what each element needs of atol
        failed = int(np.count_nonzero(slack > atol)) if diff.size else 0
        needed_atol = _smallest_passing_atol(diff, magnitude, slack, rtol)
    if nan_mismatch:
        status = Status.NAN_MISMATCH
    elif failed:
        status = Status.FAIL
    else:
        status = Status.PASS
    return {
        "status": status,
        "max_abs_error": float(diff.max()) if diff.size else 0.0,
        "max_rel_error": _max_relative(diff, magnitude, out=slack),
        "mismatch_fraction": (failed + nan_mismatch) / size,
        "min_passing_atol": None if nan_mismatch else needed_atol,
        "nan_mismatch": nan_mismatch,
    }


def _smallest_passing_atol(diff: np.ndarray, magnitude: np.ndarray, slack: np.ndarray,
                           rtol: float) -> float:
    """The smallest atol with ``diff <= atol + rtol * magnitude`` everywhere.

    ``max(slack)`` can round down by a unit in the last place, so the candidate is
    nudged up until the check it stands for really passes.
    """
    if not diff.size:
        return 0.0
    atol = max(float(slack.max()), 0.0)
    while math.isfinite(atol) and not np.all(diff <= atol + rtol * magnitude):
        atol = float(np.nextafter(atol, math.inf))
    return atol


def _max_relative(diff: np.ndarray, magnitude: np.ndarray, *, out: np.ndarray) -> float:
    """Largest ``diff / magnitude`` over elements with a non-zero reference (into ``out``)."""
    if not diff.size:
        return 0.0
    out[...] = 0.0
    np.divide(diff, magnitude, out=out, where=magnitude > 0)
    return float(out.max())
