"""The one place where two arrays are judged equal or not.

Every tolerance rule of bisect-onnx lives in :func:`compare_arrays`: how NaN and Inf
are matched, how integers and booleans are compared, what the relative error of a
zero reference is. Table, JSON and verdict all read the :class:`ArrayComparison` it
returns; nothing else recomputes an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
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

    def result(status: str, **figures: float | int | None) -> ArrayComparison:
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
        # Integers and booleans: exact equality; the "error" is the largest difference.
        ref = reference.astype(np.float64)
        cand = candidate.astype(np.float64)
        diff = np.abs(cand - ref)
        mismatched = int(np.count_nonzero(reference != candidate))
        return result(
            Status.FAIL if mismatched else Status.PASS,
            max_abs_error=float(diff.max()),
            max_rel_error=_max_relative(diff, np.abs(ref)),
            mismatch_fraction=mismatched / reference.size,
            min_passing_atol=0.0 if not mismatched else None,
        )

    # Complex numbers are judged by their modulus of difference, like numpy.allclose.
    ref = reference.astype(np.complex128 if np.iscomplexobj(reference) else np.float64)
    cand = candidate.astype(ref.dtype)
    ref_finite = np.isfinite(ref)
    cand_finite = np.isfinite(cand)
    both_finite = ref_finite & cand_finite
    # Non-finite positions agree only when both sides hold the same non-finite value.
    same_nonfinite = ~ref_finite & ~cand_finite & (
        (np.isnan(ref) & np.isnan(cand)) | (ref == cand)
    )
    nan_mismatch = int(np.count_nonzero(~both_finite & ~same_nonfinite))

    diff = np.abs(cand - ref)[both_finite]
    magnitude = np.abs(ref)[both_finite]
    over = diff > atol + rtol * magnitude
    failed = int(np.count_nonzero(over))
    max_abs = float(diff.max()) if diff.size else 0.0
    needed_atol = float(np.max(diff - rtol * magnitude)) if diff.size else 0.0

    if nan_mismatch:
        status = Status.NAN_MISMATCH
    elif failed:
        status = Status.FAIL
    else:
        status = Status.PASS
    return result(
        status,
        max_abs_error=max_abs,
        max_rel_error=_max_relative(diff, magnitude),
        mismatch_fraction=(failed + nan_mismatch) / reference.size,
        min_passing_atol=None if nan_mismatch else max(needed_atol, 0.0),
        nan_mismatch=nan_mismatch,
    )


def _max_relative(diff: np.ndarray, magnitude: np.ndarray) -> float:
    """Largest ``diff / magnitude`` over elements with a non-zero reference."""
    nonzero = magnitude > 0
    if not np.any(nonzero):
        return 0.0
    return float(np.max(diff[nonzero] / magnitude[nonzero]))
