"""Which side is wrong at a culprit node: the ONNX graph, ONNX Runtime's kernel, or neither.

A culprit node computes, from PyTorch's exact inputs, a value out of tolerance. Three
stories fit that, and each sends the user somewhere else:

- *graph semantics*: the graph means something else than the op, even in exact
  arithmetic (an exporter bug, or a bad graph edit);
- *runtime kernel*: the graph means the op, but ONNX Runtime computes it far less
  precisely than PyTorch does;
- *float precision*: both compute the op, each with float32's usual rounding; the
  tolerance is tighter than float32 allows.

Exact arithmetic is stood in for by float64: the torch op re-run with float64 tensors
and the ONNX segment run by ``onnx.reference`` with every float made double
(:mod:`bisect_onnx.search.float64_reruns`). :func:`classify` then decides from the four
arrays alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays

if TYPE_CHECKING:
    from bisect_onnx.runtime.runner import Runner

__all__ = ["DEFAULT_KERNEL_FACTOR", "Classification", "Kind", "KernelRuntime", "classify",
           "kernel_runtime"]

#: Two float32 implementations of one op round differently (summation order, fused
#: multiply-add, blocking), but by a small factor; an order of magnitude more error
#: than PyTorch's own is no longer a different rounding but a less precise kernel.
DEFAULT_KERNEL_FACTOR = 10.0

# float64 keeps about 16 digits; two float64 implementations of an op summing in
# different orders agree to about 1e-13 even over millions of terms. Below 1e-9 (still
# 60x under one float32 rounding, 6e-8) a float64 difference is rounding, not meaning,
# so a tolerance tighter than this (atol=0, say) is loosened to it in float64.
_EXACT_RTOL = 1e-9


class Kind:
    """The values of :attr:`Classification.kind`."""

    GRAPH_SEMANTICS = "graph semantics"
    RUNTIME_KERNEL = "runtime kernel"
    FLOAT_PRECISION = "float precision"
    UNCLASSIFIED = "unclassified"


#: Machine epsilon of the precisions a runtime may compute float32 values in.
_NARROW_EPSILON = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}


@dataclass(frozen=True)
class KernelRuntime:
    """The runtime whose kernel computed the candidate's value, and in what precision."""

    name: str = "ONNX Runtime"
    repository: str = "microsoft/onnxruntime"
    precision: str | None = None
    """``bf16`` or ``f16`` where it computes float32 values in that (OpenVINO's
    inference precision): one rounding is then that precision's, not float32's."""


def kernel_runtime(candidate: Runner) -> KernelRuntime:
    """The runtime of a runner, as the registry names it (its precision where narrower)."""
    from bisect_onnx.runtime.registry import display_name, repository

    precision = candidate.precision
    return KernelRuntime(display_name(candidate.runtime), repository(candidate.runtime),
                         precision if precision in _NARROW_EPSILON else None)


@dataclass(frozen=True)
class Classification:
    """Which side a culprit's divergence is on, the figures that decided it, where to file it."""

    kind: str
    """One of :class:`Kind`."""
    detail: str
    """One line with the figures that decided it."""
    file_with: str
    """One line: where to file the bug, or ``no bug: ...``."""
    torch_vs_onnx64: float | None
    """Max abs difference of the torch op and the ONNX segment, both in float64."""
    ort_error: float | None
    """Max abs ``|ONNX Runtime's value - float64 truth|`` (inf where NaN/Inf mismatch)."""
    torch_error: float | None
    """Max abs ``|PyTorch's float32 value - float64 truth|`` (inf where NaN/Inf mismatch)."""


def classify(
    *,
    torch64: np.ndarray | None,
    onnx64: np.ndarray | None,
    torch32: np.ndarray,
    ort32: np.ndarray,
    rtol: float,
    atol: float,
    kernel_factor: float = DEFAULT_KERNEL_FACTOR,
    runtime: KernelRuntime = KernelRuntime(),
) -> Classification:
    """Say which side is wrong, from the op and the segment in float64 and both float32 values.

    ``torch64`` is the torch op in float64 (the truth), ``onnx64`` the ONNX segment in
    float64, ``torch32`` and ``ort32`` what PyTorch and ONNX Runtime computed. Graph
    semantics when ``torch64`` and ``onnx64`` fail the tolerance (a tolerance tighter
    than float64 rounding is loosened to it); runtime kernel when they agree but
    ``ort32`` fails the tolerance against the truth and is off it by more than
    ``kernel_factor`` times the larger of PyTorch's own float32 error and one rounding of
    ``ort32``'s dtype at the value's scale (its largest magnitude); float precision
    otherwise. Unclassified when either float64 value is missing. ``runtime``: whose
    kernel ``ort32`` is, and the precision it computes in (bf16 rounds at bf16's scale).
    """
    if torch64 is None or onnx64 is None:
        missing = [name for name, value in (("the torch op", torch64),
                                            ("the ONNX segment", onnx64)) if value is None]
        return _unclassified(f"{' and '.join(missing)} could not be run in float64 (a non-float "
                             "value, an unresolved argument or an op without a float64 form; "
                             "the debug log says which)")
    truth = np.asarray(torch64, dtype=np.float64)
    if np.shape(torch32) != truth.shape:
        return _unclassified(f"PyTorch's value is shaped {list(np.shape(torch32))} but the op "
                             f"re-run in float64 gives {list(truth.shape)}")
    figures = _Figures.measure(truth, onnx64, torch32, ort32, rtol=rtol, atol=atol)
    if not figures.semantics.passed:
        return figures.result(Kind.GRAPH_SEMANTICS,
                              f"in float64 the ONNX segment differs from the torch op "
                              f"{_amount(figures.semantics)} (rtol={rtol:g}, atol={atol:g}): the "
                              "graph computes something else, whatever the precision",
                              'file it with the exporter (pytorch/pytorch, label "module: onnx"), '
                              "or with whoever edited the graph after export")
    agree = f"in float64 the ONNX segment agrees with the torch op (within {figures.gap:.3g})"
    # PyTorch's own error sets the bar; one rounding at the value's scale stands in where
    # PyTorch's float32 happens to be exact (small integers), so that it is never 0.
    bar, bar_name = max((figures.torch_error, "PyTorch's own float32 error"),
                        _rounding(ort32, figures.scale, runtime.precision))
    ort, ort_error = figures.ort, figures.ort_error
    if not ort.passed and (ort_error is None or ort_error > kernel_factor * bar):
        off = (f"is off the float64 truth {_amount(ort)}" if ort_error is None else
               f"is off the float64 truth {_amount(ort)}, more than {kernel_factor:g}x "
               f"{bar_name} ({bar:.3g})")
        return figures.result(Kind.RUNTIME_KERNEL, f"{agree}, but {runtime.name}'s value {off}",
                              f"file it with {runtime.repository}: it does not compute what "
                              "the graph means; attach the --repro-dir segment")
    if ort.passed:
        why = (f"{runtime.name}'s value is within tolerance of the float64 truth (off by "
               f"{ort_error:.3g}), PyTorch's own float32 is off by {figures.torch_error:.3g}: "
               "the reference is the less precise side")
    else:
        why = (f"{runtime.name}'s error {ort_error:.3g} against the float64 truth is within "
               f"{kernel_factor:g}x {bar_name} ({bar:.3g})")
    return figures.result(Kind.FLOAT_PRECISION, f"{agree}; {why}",
                          f"no bug: float rounding; loosen the tolerance"
                          f"{_would_pass(torch32, ort32, rtol=rtol, atol=atol)}, or compute in "
                          "higher precision")


@dataclass(frozen=True)
class _Figures:
    """The three float64 comparisons :func:`classify` decides from."""

    semantics: ArrayComparison
    """The ONNX segment in float64 against the truth (a tolerance loosened to float64's)."""
    ort: ArrayComparison
    """ONNX Runtime's value against the truth."""
    reference: ArrayComparison
    """PyTorch's float32 value against the truth."""
    scale: float
    """The truth's largest finite magnitude."""

    @classmethod
    def measure(cls, truth: np.ndarray, onnx64: np.ndarray, torch32: np.ndarray,
                ort32: np.ndarray, *, rtol: float, atol: float) -> _Figures:
        """Compare the segment in float64 and both float32 values with the truth."""
        scale = _scale(truth)
        return cls(
            semantics=compare_arrays(truth, np.asarray(onnx64, dtype=np.float64),
                                     rtol=max(rtol, _EXACT_RTOL),
                                     atol=max(atol, _EXACT_RTOL * scale)),
            ort=compare_arrays(truth, np.asarray(ort32, dtype=np.float64), rtol=rtol, atol=atol),
            reference=compare_arrays(truth, np.asarray(torch32, dtype=np.float64), rtol=rtol,
                                     atol=atol),
            scale=scale)

    @property
    def gap(self) -> float | None:
        return _error(self.semantics)

    @property
    def ort_error(self) -> float | None:
        return _error(self.ort)

    @property
    def torch_error(self) -> float | None:
        return _error(self.reference)

    def result(self, kind: str, detail: str, file_with: str) -> Classification:
        """The classification, with these figures."""
        return Classification(kind, detail, file_with, torch_vs_onnx64=self.gap,
                              ort_error=self.ort_error, torch_error=self.torch_error)


def _would_pass(torch32: np.ndarray, ort32: np.ndarray, *, rtol: float, atol: float) -> str:
    """`` to atol=... at rtol=...``: what would let both float32 values agree, or nothing."""
    both = compare_arrays(np.asarray(torch32, dtype=np.float64),
                          np.asarray(ort32, dtype=np.float64), rtol=rtol, atol=atol)
    return ("" if both.min_passing_atol is None else
            f" to atol={both.min_passing_atol:.3g} at rtol={rtol:g}")


def _unclassified(detail: str) -> Classification:
    return Classification(Kind.UNCLASSIFIED, detail,
                          "unknown: compare the op and the ONNX segment by hand in float64 to "
                          "tell the exporter from the runtime",
                          torch_vs_onnx64=None, ort_error=None, torch_error=None)


def _error(comparison: ArrayComparison) -> float | None:
    """The max abs error; inf where NaN/Inf do not match, ``None`` for another shape."""
    if comparison.status == Status.NAN_MISMATCH:
        return float("inf")
    return comparison.max_abs_error


def _amount(comparison: ArrayComparison) -> str:
    """``by up to 0.0154``, ``in shape ([2, 3] vs [2, 1])`` or ``in where NaN/Inf are``."""
    if comparison.status == Status.SHAPE_MISMATCH:
        return f"in shape ({list(comparison.candidate_shape)} vs {list(comparison.shape)})"
    if comparison.status == Status.NAN_MISMATCH:
        return f"in where NaN/Inf are ({comparison.nan_mismatch} elements)"
    return f"by up to {comparison.max_abs_error:.3g}"


def _scale(array: np.ndarray) -> float:
    """The largest finite magnitude of ``array`` (0 when it has none)."""
    finite = np.abs(array[np.isfinite(array)])
    return float(finite.max()) if finite.size else 0.0


def _rounding(array: np.ndarray, scale: float,
              precision: str | None = None) -> tuple[float, str]:
    """One rounding (machine epsilon) of ``array``'s float type at ``scale``, and its name.

    ``precision``: the narrower type the runtime computed the value in (``bf16``).
    """
    if precision in _NARROW_EPSILON:
        return _NARROW_EPSILON[precision] * scale, f"one {precision} rounding at the value's scale"
    dtype = np.asarray(array).dtype
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float32)
    return float(np.finfo(dtype).eps) * scale, f"one {dtype.name} rounding at the value's scale"
