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
from bisect_onnx.judge.vocabulary import Status

__all__ = ["ArrayComparison", "Status", "compare_arrays", "check_tolerances"]

# Defaults chosen for float32 models: float32 has ~7 significant digits, and a few
# hundred accumulated roundings (a deep conv stack) cost about three of them.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-5


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
    figures = _figures(reference, candidate, rtol=rtol, atol=atol)
    return ArrayComparison(
        status=figures["status"],
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


# The figures of two arrays that agree exactly.
_EQUAL = {"status": Status.PASS, "max_abs_error": 0.0, "max_rel_error": 0.0,
          "mismatch_fraction": 0.0, "min_passing_atol": 0.0}


def _figures(reference: np.ndarray, candidate: np.ndarray, *, rtol: float,
             atol: float) -> dict[str, Any]:
    """Status and error figures, by the rule for the arrays' kind (see :func:`compare_arrays`)."""
    if reference.shape != candidate.shape:
        return {"status": Status.SHAPE_MISMATCH}
    if reference.dtype != candidate.dtype:
        return {"status": Status.DTYPE_MISMATCH}
    if reference.size == 0:
        return dict(_EQUAL)
    if not np.issubdtype(reference.dtype, np.inexact):
        return _exact_figures(reference, candidate)
    if (reference.dtype == np.float32 and reference.size >= _SCREEN_FROM
            and reference.ndim and rtol >= 0 and atol >= 0):
        figures = _screened_figures(reference, candidate, rtol=rtol, atol=atol)
        if figures is not None:
            return figures
    return _inexact_figures(reference, candidate, rtol=rtol, atol=atol)


def _exact_figures(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """Integers and booleans: exact equality.

    The error figures are computed with Python integers on the mismatched elements
    only, so that int64 values past 2**53 (where float64 loses the units digit) still
    show their difference.
    """
    unequal = reference != candidate
    mismatched = int(np.count_nonzero(unequal))
    if not mismatched:
        return dict(_EQUAL)
    ref = reference[unequal].astype(object)
    diff = np.abs(candidate[unequal].astype(object) - ref)
    magnitude = np.abs(ref)
    nonzero = magnitude != 0
    return {
        "status": Status.FAIL,
        "max_abs_error": float(diff.max()),
        "max_rel_error": float((diff[nonzero] / magnitude[nonzero]).max()) if nonzero.any()
        else 0.0,
        "mismatch_fraction": mismatched / reference.size,
        "min_passing_atol": None,
    }


def _inexact_figures(reference: np.ndarray, candidate: np.ndarray, *, rtol: float,
                     atol: float) -> dict[str, Any]:
    """Floating-point and complex arrays, in float64 (complex128): the reference figures."""
    # Complex numbers are judged by their modulus of difference, like numpy.allclose.
    ref = reference.astype(np.complex128 if np.iscomplexobj(reference) else np.float64)
    cand = candidate.astype(ref.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        difference = cand - ref
    # A sum is finite only if every term is (NaN and Inf propagate); one that overflows
    # takes the careful path below, which gives the same answer.
    if math.isfinite(abs(difference.sum())):
        # The usual case, and the one that must be fast: every value finite on both
        # sides (a NaN or Inf on either would make the difference non-finite). The
        # float64 copies are reused in place: a large model has hundreds of values.
        if isinstance(difference, np.ndarray) and difference.dtype.kind == "f":
            return _finite_figures(np.abs(difference, out=difference), np.abs(ref, out=ref),
                                   reference.size, rtol=rtol, atol=atol)
        return _finite_figures(np.abs(difference), np.abs(ref), reference.size,
                               rtol=rtol, atol=atol)
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
        return _finite_figures(np.abs(cand[both_finite] - ref[both_finite]),
                               np.abs(ref[both_finite]), reference.size,
                               rtol=rtol, atol=atol, nan_mismatch=nan_mismatch)


# float32 arrays this large are compared in float32 first, and in float64 only where the
# answer depends on it: the few elements near the tolerance or near a maximum. They go
# in chunks small enough to stay in cache (fresh large temporaries cost page faults).
_SCREEN_FROM = 1 << 14
_SCREEN_CHUNK = 1 << 15
# How far apart the float32 and float64 figures of one element can be, relative to the
# magnitudes involved: each float32 operation rounds by at most 2**-24, and four are
# chained; 2**-20 leaves a wide margin. The absolute part covers subnormal results.
_SCREEN_RELATIVE = 2.0**-20
_SCREEN_ABSOLUTE = 1e-43


def _screened_figures(reference: np.ndarray, candidate: np.ndarray, *, rtol: float,
                      atol: float) -> dict[str, Any] | None:
    """The figures :func:`_finite_figures` gives in float64, at float32's cost.

    Every figure is a count or a maximum: float32 arithmetic finds the elements that
    could decide it (all but a few are far from any threshold), and those are
    recomputed in float64, so the result is the float64 one exactly. ``None`` when a
    value is not finite (or float32 arithmetic overflows): the float64 path decides.
    """
    reference, candidate = reference.reshape(-1), candidate.reshape(-1)
    failed = 0
    # Each figure is the largest of the chunks' (the smallest passing atol too: an atol
    # that passes every chunk is at least each chunk's smallest, and their largest does).
    max_abs = max_relative = needed_atol = 0.0
    for start in range(0, reference.size, _SCREEN_CHUNK):
        ref = reference[start:start + _SCREEN_CHUNK]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            diff = np.abs(candidate[start:start + _SCREEN_CHUNK] - ref)
            magnitude = np.abs(ref)
            slack = diff - magnitude * np.float32(rtol)
            relative = diff / magnitude
        largest_diff, largest_slack = float(diff.max()), float(slack.max())
        if not (math.isfinite(largest_diff) and math.isfinite(largest_slack)):
            return None
        if largest_diff == 0.0:  # equal throughout (float32 subtraction is exact at 0):
            continue  # no error, no failure, and slack -rtol*|reference| <= 0 everywhere
        band = (_SCREEN_RELATIVE * (largest_diff + rtol * float(magnitude.max()))
                + _SCREEN_ABSOLUTE)

        def exact(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return _float64_at(reference, candidate, start + np.nonzero(mask)[0])  # noqa: B023

        if largest_slack > atol - band:  # some element may fail: count the sure ones,
            failed += int(np.count_nonzero(slack > atol + band))  # settle the rest
            unsure_diff, unsure_magnitude = exact((slack > atol - band) & (slack <= atol + band))
            failed += int(np.count_nonzero(unsure_diff - rtol * unsure_magnitude > atol))
        max_abs = max(max_abs, float(exact(diff >= largest_diff - band)[0].max()))
        # The smallest passing atol is at least 0, which an element equal on both sides
        # never exceeds: a ReLU's zeros are left out.
        near_diff, near_magnitude = exact((slack >= largest_slack - band) & (diff > 0))
        if near_diff.size:
            near_allowed = rtol * near_magnitude
            needed_atol = max(needed_atol, _smallest_passing_atol(
                near_diff, near_allowed, near_diff - near_allowed))
        relative[magnitude == 0] = 0.0  # undefined there; max_abs_error covers them
        largest_relative = float(relative.max())
        if largest_relative > 0:
            rel_diff, rel_magnitude = exact(
                relative >= largest_relative * (1 - _SCREEN_RELATIVE))
            max_relative = max(max_relative, _max_relative(
                rel_diff, rel_magnitude, out=np.empty_like(rel_diff)))
    return {
        "status": Status.FAIL if failed else Status.PASS,
        "max_abs_error": max_abs,
        "max_rel_error": max_relative,
        "mismatch_fraction": failed / reference.size,
        "min_passing_atol": needed_atol,
        "nan_mismatch": 0,
    }


def _float64_at(reference: np.ndarray, candidate: np.ndarray,
                indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``|candidate - reference|`` and ``|reference|`` in float64 at flat ``indices``."""
    ref = reference[indices].astype(np.float64)
    return np.abs(candidate[indices].astype(np.float64) - ref), np.abs(ref)


def _finite_figures(diff: np.ndarray, magnitude: np.ndarray, size: int, *, rtol: float,
                    atol: float, nan_mismatch: int = 0) -> dict[str, Any]:
    """Status and figures from the finite pairs' ``|difference|`` and ``|reference|``."""
    # A 0-d pair (a scalar output) would turn into numpy scalars below, not arrays.
    diff, magnitude = np.atleast_1d(diff), np.atleast_1d(magnitude)
    with np.errstate(over="ignore", invalid="ignore"):
        allowed = rtol * magnitude  # what rtol allows each element
        slack = diff - allowed  # what each element needs of atol
        failed = int(np.count_nonzero(slack > atol)) if diff.size else 0
        needed_atol = _smallest_passing_atol(diff, allowed, slack)
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


def _smallest_passing_atol(diff: np.ndarray, allowed: np.ndarray, slack: np.ndarray) -> float:
    """The smallest atol with ``diff <= atol + allowed`` everywhere.

    ``allowed`` is ``rtol * |reference|``. ``max(slack)`` can round down by a unit in
    the last place, so the candidate is nudged up until the check it stands for really
    passes.
    """
    if not diff.size:
        return 0.0
    atol = max(float(slack.max()), 0.0)
    while math.isfinite(atol) and not np.all(diff <= atol + allowed):
        atol = float(np.nextafter(atol, math.inf))
    return atol


def _max_relative(diff: np.ndarray, magnitude: np.ndarray, *, out: np.ndarray) -> float:
    """Largest ``diff / magnitude`` over elements with a non-zero reference (into ``out``)."""
    if not diff.size:
        return 0.0
    out[...] = 0.0
    np.divide(diff, magnitude, out=out, where=magnitude > 0)
    return float(out.max())
