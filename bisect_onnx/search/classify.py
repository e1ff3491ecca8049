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
(:func:`torch_op_in_float64`) and the ONNX segment run by ``onnx.reference`` with every
float made double (:func:`onnx_segment_in_float64`). :func:`classify` then decides from
the four arrays alone.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import one_line
from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays
from bisect_onnx.search.decomposition import _CannotIsolate, _weight_of

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["DEFAULT_KERNEL_FACTOR", "Classification", "Kind", "classify",
           "onnx_segment_in_float64", "torch_op_in_float64"]

logger = logging.getLogger(__name__)

#: Two float32 implementations of one op round differently (summation order, fused
#: multiply-add, blocking), but by a small factor; an order of magnitude more error
#: than PyTorch's own is no longer a different rounding but a less precise kernel.
DEFAULT_KERNEL_FACTOR = 10.0

# float64 keeps about 16 digits; two float64 implementations of an op summing in
# different orders agree to about 1e-13 even over millions of terms. Below 1e-9 (still
# 60x under one float32 rounding, 6e-8) a float64 difference is rounding, not meaning,
# so a tolerance tighter than this (atol=0, say) is loosened to it in float64.
_EXACT_RTOL = 1e-9

# Cast targets and dtypes rewritten to double. The float8 and float4 types are left
# alone: a cast to them is a deliberate quantization, part of what the graph means.
_PROMOTED_TYPES = frozenset({1, 10, 16})  # FLOAT, FLOAT16, BFLOAT16
_DOUBLE = 11


class Kind:
    """The values of :attr:`Classification.kind`."""

    GRAPH_SEMANTICS = "graph semantics"
    RUNTIME_KERNEL = "runtime kernel"
    FLOAT_PRECISION = "float precision"
    UNCLASSIFIED = "unclassified"


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
) -> Classification:
    """Say which side is wrong, from the op and the segment in float64 and both float32 values.

    ``torch64`` is the torch op in float64 (the truth), ``onnx64`` the ONNX segment in
    float64, ``torch32`` and ``ort32`` what PyTorch and ONNX Runtime computed. Graph
    semantics when ``torch64`` and ``onnx64`` fail the tolerance (a tolerance tighter
    than float64 rounding is loosened to it); runtime kernel when they agree but
    ``ort32`` fails the tolerance against the truth and is off it by more than
    ``kernel_factor`` times the larger of PyTorch's own float32 error and one rounding of
    ``ort32``'s dtype at the value's scale (its largest magnitude); float precision
    otherwise. Unclassified when either float64 value is missing.
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
    scale = _scale(truth)
    semantics = compare_arrays(truth, np.asarray(onnx64, dtype=np.float64),
                               rtol=max(rtol, _EXACT_RTOL), atol=max(atol, _EXACT_RTOL * scale))
    ort = compare_arrays(truth, np.asarray(ort32, dtype=np.float64), rtol=rtol, atol=atol)
    reference = compare_arrays(truth, np.asarray(torch32, dtype=np.float64), rtol=rtol, atol=atol)
    gap, ort_error, torch_error = _error(semantics), _error(ort), _error(reference)

    def result(kind: str, detail: str, file_with: str) -> Classification:
        return Classification(kind, detail, file_with, torch_vs_onnx64=gap, ort_error=ort_error,
                              torch_error=torch_error)

    if not semantics.passed:
        return result(Kind.GRAPH_SEMANTICS,
                      f"in float64 the ONNX segment differs from the torch op "
                      f"{_amount(semantics)} (rtol={rtol:g}, atol={atol:g}): the graph computes "
                      "something else, whatever the precision",
                      'file it with the exporter (pytorch/pytorch, label "module: onnx"), or '
                      "with whoever edited the graph after export")
    agree = f"in float64 the ONNX segment agrees with the torch op (within {gap:.3g})"
    # PyTorch's own error sets the bar; one rounding at the value's scale stands in where
    # PyTorch's float32 happens to be exact (small integers), so that it is never 0.
    bar, bar_name = max((torch_error, "PyTorch's own float32 error"),
                        _rounding(ort32, scale))
    if not ort.passed and (ort_error is None or ort_error > kernel_factor * bar):
        off = (f"is off the float64 truth {_amount(ort)}" if ort_error is None else
               f"is off the float64 truth {_amount(ort)}, more than {kernel_factor:g}x "
               f"{bar_name} ({bar:.3g})")
        return result(Kind.RUNTIME_KERNEL, f"{agree}, but ONNX Runtime's value {off}",
                      "file it with microsoft/onnxruntime: it does not compute what the graph "
                      "means; attach the --repro-dir segment")
    if ort.passed:
        why = (f"ONNX Runtime's value is within tolerance of the float64 truth (off by "
               f"{ort_error:.3g}), PyTorch's own float32 is off by {torch_error:.3g}: the "
               "reference is the less precise side")
    else:
        why = (f"ONNX Runtime's error {ort_error:.3g} against the float64 truth is within "
               f"{kernel_factor:g}x {bar_name} ({bar:.3g})")
    both = compare_arrays(np.asarray(torch32, dtype=np.float64),
                          np.asarray(ort32, dtype=np.float64), rtol=rtol, atol=atol)
    would_pass = ("" if both.min_passing_atol is None else
                  f" to atol={both.min_passing_atol:.3g} at rtol={rtol:g}")
    return result(Kind.FLOAT_PRECISION, f"{agree}; {why}",
                  f"no bug: float rounding; loosen the tolerance{would_pass}, or compute in "
                  "higher precision")


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


def _rounding(array: np.ndarray, scale: float) -> tuple[float, str]:
    """One rounding (machine epsilon) of ``array``'s float type at ``scale``, and its name."""
    dtype = np.asarray(array).dtype
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float32)
    return float(np.finfo(dtype).eps) * scale, f"one {dtype.name} rounding at the value's scale"


class _CannotRun(Exception):
    """The op or segment cannot be run in float64; the message says why, in one line."""


def torch_op_in_float64(
    fx_node: torch.fx.Node,
    program: ExportedProgram,
    reference_values: Mapping[str, np.ndarray],
) -> np.ndarray | None:
    """Run the FX node's target with every floating tensor argument cast to float64.

    Activations come from ``reference_values`` (PyTorch's values by FX node name),
    weights from ``program``; a floating ``dtype`` argument (``aten.to``, ``aten.full``)
    becomes float64 too. An ``operator.getitem`` node re-runs the op it picks from.
    ``None`` when the op cannot be run that way (a non-float result, an argument that
    cannot be resolved, the op refusing float64); the debug log says why.
    """
    import torch

    try:
        result = _run_in_float64(fx_node, program, reference_values)
    except (_CannotRun, _CannotIsolate) as error:
        logger.debug("cannot re-run %s in float64: %s", fx_node.name, error)
        return None
    except Exception as error:  # an op refusing float64 is the model's business, not a bug
        logger.debug("re-running %s in float64 failed: %s", fx_node.name, one_line(error),
                     exc_info=True)
        return None
    if not isinstance(result, torch.Tensor):
        logger.debug("cannot re-run %s in float64: it returns a %s, not a tensor", fx_node.name,
                     type(result).__name__)
        return None
    if result.dtype != torch.float64:
        logger.debug("cannot re-run %s in float64: it computes %s even from float64 inputs",
                     fx_node.name, result.dtype)
        return None
    return result.detach().numpy()


def _run_in_float64(fx_node: torch.fx.Node, program: ExportedProgram,
                    reference_values: Mapping[str, np.ndarray]) -> Any:
    """The op's raw result (a tensor, a tuple of them, ...) on float64 arguments."""
    import torch
    from torch.fx.node import map_aggregate

    if fx_node.op != "call_function":
        raise _CannotRun(f"{fx_node.name} is a {fx_node.op} node, not an op call")
    if fx_node.target is operator.getitem and isinstance(fx_node.args[0], torch.fx.Node):
        # The tuple an op returns has no reference value of its own: re-run the op.
        return _run_in_float64(fx_node.args[0], program, reference_values)[fx_node.args[1]]

    def promote(item: Any) -> Any:
        if isinstance(item, torch.dtype):
            return torch.float64 if item.is_floating_point else item
        if not isinstance(item, torch.fx.Node):
            return item
        weight = _weight_of(item, program)
        if weight is not None:
            tensor = weight[1]
        else:
            value = reference_values.get(item.name)
            if isinstance(value, (bool, int, float)):
                return value  # a symbolic size, say
            if not isinstance(value, np.ndarray):
                raise _CannotRun(f"argument {item.name} has no reference array"
                                 + ("" if value is None else f" (a {type(value).__name__})"))
            tensor = torch.from_numpy(np.array(value))  # a copy: the op may not write into it
        return tensor.to(torch.float64) if tensor.is_floating_point() else tensor

    args, kwargs = map_aggregate((fx_node.args, fx_node.kwargs), promote)
    with torch.no_grad():
        return fx_node.target(*args, **kwargs)


def onnx_segment_in_float64(
    segment: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    output: str,
) -> np.ndarray | None:
    """Evaluate ``segment`` with ``onnx.reference``, every float made float64; ``output``'s value.

    Float32, float16 and bfloat16 feeds, initializers, tensor attributes (Constant
    values) and value types become double, as do Cast targets and ``dtype``
    attributes, so that no node drops back to a narrower float; the caller's model is
    left as it is. Weights must be inside the model (external data embedded).
    ``None`` when the evaluator cannot run it (a contrib op such as com.microsoft
    FusedConv) or ``output`` is not a float; the debug log says why.
    """
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.ModelProto()
    model.CopyFrom(segment)
    try:
        _promote_graph(model.graph)
        for function in model.functions:
            for node in function.node:
                _promote_node(node)
        promoted = {name: _promote_array(np.asarray(value)) for name, value in feeds.items()}
        result = ReferenceEvaluator(model).run([output], promoted)[0]
    except _CannotRun as error:
        logger.debug("cannot evaluate the segment for %s in float64: %s", output, error)
        return None
    except Exception as error:  # an op the evaluator lacks is the model's business, not a bug
        logger.debug("onnx.reference cannot evaluate the segment for %s in float64: %s", output,
                     one_line(error), exc_info=True)
        return None
    result = np.asarray(result)
    if result.dtype != np.float64:
        logger.debug("the segment computes %s as %s even in float64: not a float value, or a "
                     "node the rewrite missed", output, result.dtype)
        return None
    return result


def _promote_array(array: np.ndarray) -> np.ndarray:
    if np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16":
        return array.astype(np.float64)
    return array


def _promote_graph(graph: onnx.GraphProto) -> None:
    """Rewrite ``graph`` (and its subgraphs) in place so that every float is double."""
    for tensor in graph.initializer:
        _promote_tensor(tensor)
    for sparse in graph.sparse_initializer:
        _promote_tensor(sparse.values)
    for value in (*graph.input, *graph.output, *graph.value_info):
        _promote_type(value.type)
    for node in graph.node:
        _promote_node(node)


def _promote_node(node: onnx.NodeProto) -> None:
    import onnx

    default_domain = node.domain in ("", "ai.onnx")
    if default_domain and node.op_type == "Constant":
        for attribute in node.attribute:
            if attribute.name in ("value_float", "value_floats"):
                # These hold float32 by definition: turn them into a double tensor.
                values = attribute.f if attribute.name == "value_float" else list(attribute.floats)
                tensor = onnx.numpy_helper.from_array(np.asarray(values, dtype=np.float64))
                attribute.CopyFrom(onnx.helper.make_attribute("value", tensor))
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR:
            _promote_tensor(attribute.t)
        elif attribute.type == onnx.AttributeProto.TENSORS:
            for tensor in attribute.tensors:
                _promote_tensor(tensor)
        elif attribute.type == onnx.AttributeProto.GRAPH:
            _promote_graph(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            for graph in attribute.graphs:
                _promote_graph(graph)
        elif (default_domain and attribute.type == onnx.AttributeProto.INT
              and (attribute.name == "dtype" or (node.op_type == "Cast" and attribute.name == "to"))
              and attribute.i in _PROMOTED_TYPES):
            attribute.i = _DOUBLE


def _promote_tensor(tensor: onnx.TensorProto) -> None:
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    if tensor.data_type not in _PROMOTED_TYPES:
        return
    if uses_external_data(tensor):
        raise _CannotRun(f"weight {tensor.name!r} keeps its data outside the model; embed it "
                         "first (bisect_onnx.report.repro._embed_external_data)")
    promoted = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64),
                                       tensor.name)
    tensor.CopyFrom(promoted)


def _promote_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type in _PROMOTED_TYPES:
            inner.elem_type = _DOUBLE
    elif kind in ("sequence_type", "optional_type"):
        _promote_type(getattr(type_proto, kind).elem_type)
