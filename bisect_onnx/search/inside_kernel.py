"""The node that went wrong inside a fused kernel, named by the value PyTorch has there.

A culprit's local check reruns a kernel the runtime fused (a Conv with its residual Add
and ReLU) and computes every value inside it; PyTorch still has those values (an op's,
a module call's), so the first one that fails names the node, with its own op, module
and source line (:func:`name_inside_kernels`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.judge.compare import Status, compare_arrays
from bisect_onnx.judge.findings import KERNEL_VALUES, AttributionFindings, LocalFigures, RowRef
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import Judge, Tolerance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.claims import compute_nodes, exceeds, isolation, narrowed_segment
from bisect_onnx.search.classify import Kind
from bisect_onnx.search.local import LocalCheck

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.judge.compare import ArrayComparison
    from bisect_onnx.runtime.runner import Runner
    from bisect_onnx.search.classify import Classification

__all__ = ["InsideKernels", "name_inside_kernels", "first_failing_inside"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InsideKernels:
    """Both sides' values inside the culprits' fused kernels."""

    candidate: Runner
    """The candidate, whose nodes the kernels fused."""
    checks: Mapping[str, LocalCheck]
    """Each checked value's local check: the candidate's values inside its kernel."""
    references: Mapping[str, CapturedValue]
    """The reference's values inside the kernels, by the candidate's names."""


def name_inside_kernels(report: Reading, findings: AttributionFindings, first: str,
                         inside: InsideKernels,
                         op_segments: Mapping[str, Sequence[NodeInfo]] | None,
                         tolerance: Judge,
                         classify_inside: Callable[..., Classification | None] | None = None
                         ) -> AttributionFindings:
    """Where a culprit's segment holds a fused kernel, name the failing value inside it.

    The value inside is a culprit only where the nodes that computed it from values
    that pass are one node or one op; its record joins ``kernel_values``. It takes the
    kernel's classification, or, where that is unclassified, its own where
    ``classify_inside(inner, nodes, check, tolerance)`` gives one.
    """
    rows = {record.onnx_value: record for record in reversed(report.comparisons)}
    candidate, checks = inside.candidate, inside.checks
    culprits = list(findings.culprits) or [RowRef(first)]
    checked, kernel_values, evidence = dict(findings.kernel_checked), [], dict(findings.evidence)
    refs = []
    for ref in culprits:
        found = None
        if ref.value in rows:  # the kernel's row, with the kernel's classification
            kernel = replace(rows[ref.value], local=replace(
                rows[ref.value].local, classification=findings.checked[ref.value].classification))
            found = first_failing_inside(kernel, checks[ref.value], candidate,
                                         inside.references, tolerance.of(kernel))
        if found is None:
            refs.append(ref)
            continue
        inner, own_nodes = found
        compute = compute_nodes(candidate.nodes, own_nodes)
        kind = isolation(compute, op_segments)
        if kind is None:  # several ops inside: the kernel's value stands, its segment narrows
            refs.append(ref)
            if ref.value == first and findings.segment is not None:
                findings = replace(findings, segment=narrowed_segment(
                    candidate.nodes, own_nodes, compute, inner))
            continue
        if classify_inside is not None and inner.local.classification in (None, Kind.UNCLASSIFIED):
            try:
                own = classify_inside(inner, own_nodes, checks[ref.value],
                                      tolerance.of(rows[ref.value]))
            except Exception:  # noqa: BLE001 - a refinement must not cost the node's name
                logger.info("could not classify %s on its own", inner.onnx_value,
                            exc_info=True)
                own = None
            if own is not None and own.kind != Kind.UNCLASSIFIED:
                inner = replace(inner, local=replace(inner.local, classification=own.kind))
                if ref.value == first:
                    evidence["classification"] = asdict(own)
        kernel_values.append(inner)
        checked[inner.onnx_value] = LocalFigures(
            introduced_here=True, local_max_abs_error=inner.local.max_abs_error,
            local_status=inner.local.status, local_nan_mismatch=inner.figures.nan_mismatch,
            local_exceeds=exceeds(inner, tolerance.of(inner).atol),
            classification=inner.local.classification,
            compute_nodes=tuple(node.name for node in compute), isolation=kind)
        refs.append(RowRef(inner.onnx_value, KERNEL_VALUES))
        if ref.value == first:
            evidence["inside_kernel"] = {"value": inner.onnx_value, "node": inner.onnx_node,
                                         "kernel_output": first}
    if not findings.culprits:  # the kernel's value was a segment: the value inside is not
        refs = [ref for ref in refs if ref.table == KERNEL_VALUES]
        if refs:
            findings = replace(findings, segment=None)
    return replace(findings, kernel_checked=checked, culprits=tuple(refs),
                   kernel_values=tuple(kernel_values), evidence=evidence)


def first_failing_inside(record: Record, check: LocalCheck, candidate: Runner,
                         references: Mapping[str, CapturedValue],
                         tolerance: Tolerance) -> tuple[Record, list[int]] | None:
    """The first value inside the culprit's segment that PyTorch has and that fails.

    The segment reaches back through values ONNX Runtime fused away (a Conv's output
    inside a FusedConv); PyTorch still has them, so the node that went wrong inside
    the kernel can be named, with its own op, module and source line. With it, the
    segment's nodes that computed it from values that pass or were fed
    (:func:`_computing`).
    """
    from bisect_onnx.graph.nodes import node_provenance

    if check.segment is None:
        return None
    passed: set[str] = set()
    failing: list[tuple[int, NodeInfo, str, ArrayComparison]] = []  # in graph order
    for position, index in enumerate(check.segment.nodes):
        node = candidate.nodes[index]
        if check.value in node.outputs:
            break
        for output in node.outputs:
            reference, local = references.get(output), check.values.get(output)
            if (reference is None or local is None
                    or reference.array.shape != local.shape
                    or _other_integers(reference.array.dtype, local.dtype)):
                continue
            # At the culprit's own tolerance (a per-value rule), not the report's base.
            comparison = compare_arrays(reference.array, local, rtol=tolerance.rtol,
                                        atol=tolerance.atol)
            if comparison.status == Status.PASS:
                passed.add(output)
            else:
                failing.append((position, node, output, comparison))
    # A failing value every path of which to the kernel's output meets a value that
    # passes is masked on the way (a comparison's NaN handling under an And with IsInf,
    # seed 2019): it is not where the output's error comes from.
    reaching = set(_computing(candidate, check.segment.nodes, check.value, passed))
    for position, node, output, comparison in failing:
        if check.segment.nodes[position] not in reaching:
            continue
        value = CapturedValue(output, check.values[output], node_provenance(node, record.index))
        inner = make_record(record.index, Pair(references[output], value), comparison)
        return replace(inner, local=replace(
            inner.local, introduced_here=True, max_abs_error=comparison.max_abs_error,
            status=comparison.status, nan_mismatch=comparison.nan_mismatch,
            classification=record.local.classification)), _computing(
                           candidate, check.segment.nodes[:position + 1], output, passed)
    return None


def _computing(candidate: Runner, indices: Sequence[int], value: str,
               passed: set[str]) -> list[int]:
    """The nodes among ``indices`` that compute ``value`` from values that pass or were fed.

    Walked back from ``value`` along every input, each path stopping at a value PyTorch
    has that passed: the nodes that made it are not suspects, and a value off every path
    says nothing (an ``IsNaN`` that passes proves nothing of the ``Where`` beside it, nor a
    Slice's bounds computed from ``Shape`` of the inserted ``Mul`` before it). In order.
    """
    producers = {output: index for index in indices
                 for output in candidate.nodes[index].outputs}
    found: set[int] = set()
    pending = [value]
    while pending:
        index = producers.get(pending.pop())
        if index is None or index in found:
            continue
        found.add(index)
        pending.extend(name for name in candidate.nodes[index].inputs
                       if name and name not in passed)
    return [index for index in indices if index in found]


def _other_integers(reference: np.dtype, local: np.dtype) -> bool:
    """Integers of another type (an i64 the runtime computed as i32): not comparable."""
    return reference != local and (reference.kind in "iub" or local.kind in "iub")
