"""Each compute node of a failing segment run alone: the one that fails is the culprit.

A segment's local check runs its nodes together from values both sides captured (a
TorchScript Linear's ``MatMul`` and ``Add``, where ONNX Runtime fused the two and the
``MatMul``'s output was never a capture output). The check shows the segment fails; it
does not show which node. Where the reference has the values a node reads (PyTorch's op
values, or in ONNX against ONNX the reference graph's), that node is rerun on them,
alone: the first node that fails alone, after every compute node before it passed
alone, introduced the error, and is named with the figure of its own run. A node that
reads a value the reference has no value of (the Sqrt inside an ``rsqrt``) runs with
the nodes that make it (``run_with``); such a run that fails names no single node.
Where that cannot be decided (a node's inputs have no reference value), the segment
stands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays
from bisect_onnx.judge.findings import KERNEL_VALUES, AttributionFindings, LocalFigures, RowRef
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.claims import NODE, compute_nodes, exceeds
from bisect_onnx.search.local import LocalCheck, LocalRerun

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["narrow_to_failing_node"]

#: Nodes that hand a value on: their output is not a constant a node alone may be fed.
_CARRIERS = frozenset({"Identity", "QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class _Alone:
    """One compute node's run on the reference's values of its inputs."""

    node: NodeInfo
    value: str
    local: np.ndarray
    comparison: ArrayComparison
    members: frozenset[str]
    """The compute nodes the run computed: the node, and those that make a value of its
    inputs the reference has no value of."""


def narrow_to_failing_node(findings: AttributionFindings, check: LocalCheck | None, *, row: Record,
                           inner: Mapping[str, CapturedValue],
                           references: Mapping[str, np.ndarray],
                           candidate_values: Mapping[str, np.ndarray], rerun: LocalRerun,
                           judge_row: Callable[[str, np.ndarray], ArrayComparison] | None,
                           ) -> AttributionFindings:
    """The findings with the segment's node that fails alone as the culprit.

    ``row``: the segment's checked value's record; ``inner``: the reference's values of
    values inside segments (PyTorch's op values, the reference graph's); ``references``:
    the reference's values of the rows; ``rerun``: local checks of the candidate's
    values, judged at its tolerance; ``judge_row``: how the row's value is judged, where the run
    has a judge of its own (ONNX against ONNX). Unchanged where no segment is named or
    no node can be shown to fail alone.
    """
    if findings.segment is None or check is None or check.segment is None:
        return findings
    tolerance = rerun.tolerance
    runs, complete = _run_alone(check, findings.segment["nodes"], row, inner, references,
                                candidate_values, rerun, judge_row)
    for position, alone in enumerate(runs):
        if alone.comparison.status == Status.PASS:
            continue
        if position < complete and len(alone.members) == 1 and exceeds(
                alone.comparison, tolerance.atol):
            return _named(findings, alone, runs, row, inner, tolerance)
        break  # within the figure's reach, with nodes of its own, or after an unchecked one
    # No node named; the nodes whose runs agreed are still known to compute their values
    # right from the reference's: an op found wrong inside the segment by other means
    # (exported alone) may stand for it where every other compute node is among them.
    passed = sorted({name for run in runs if run.comparison.status == Status.PASS
                     for name in run.members})
    if not passed:
        return findings
    return replace(findings, evidence={**findings.evidence, "passed_alone": passed})


def _run_alone(check: LocalCheck, names: Sequence[str], row: Record,
               inner: Mapping[str, CapturedValue], references: Mapping[str, np.ndarray],
               candidate_values: Mapping[str, np.ndarray], rerun: LocalRerun,
               judge_row: Callable[[str, np.ndarray], ArrayComparison] | None,
               ) -> tuple[list[_Alone], int]:
    """Each compute node of ``names`` that can run alone, run in one session, in order.

    Also how many of the runs come before the first compute node that could not run
    alone: only a failure among those is the first one.
    """
    candidate, graph_inputs, tolerance = rerun.runner, rerun.graph_inputs, rerun.tolerance
    nodes = [candidate.nodes[index] for index in check.segment.nodes]
    computing = {node.name for node in compute_nodes(candidate.nodes, check.segment.nodes)}
    wanted = computing & set(names)
    initializers = {tensor.name for tensor in candidate.model.graph.initializer}
    reference_of = {**{name: value.array for name, value in inner.items()}, **references}
    # Values the segment computes from constants alone (a Reshape's target shape): exact.
    constant = {output for node in nodes if node.name not in computing
                and node.op_type not in _CARRIERS for output in node.outputs}
    # A value the reference has no value of (the Sqrt of an rsqrt) is computed where it is
    # read: value -> the compute nodes that make it from values the reference has.
    made_by: dict[str, frozenset[str]] = {}
    feeds: dict[str, np.ndarray] = {}
    order, complete = [], None
    for node in nodes:
        if node.name not in wanted and node.op_type not in _CARRIERS:
            continue
        inputs = [name for name in node.inputs if name and name not in initializers
                  and name not in graph_inputs]
        if any(name not in reference_of and name not in constant and name not in made_by
               for name in inputs):
            if node.name in wanted:
                complete = len(order) if complete is None else complete
            continue
        members = frozenset({node.name} & wanted).union(
            *(made_by[name] for name in inputs if name in made_by))
        value = check.value if check.value in node.outputs else next(
            (output for output in node.outputs if output in inner), None)
        if value is None or node.name not in wanted:
            made_by.update({output: members for output in node.outputs})
            continue
        feeds.update({name: np.asarray(reference_of[name]) if name in reference_of
                      else check.values[name] for name in inputs if name not in made_by})
        order.append((node, value, members))
    if not order:
        return [], 0
    checks = rerun([value for _, value, _ in order],
                   reference_values={**reference_of, **feeds},
                   candidate_values={**candidate_values, **feeds})
    runs = []
    for node, value, members in order:
        local = checks[value].local
        if local is None:
            complete = len(runs) if complete is None else complete
            continue
        comparison = (judge_row(value, local) if judge_row is not None and value == row.onnx_value
                      else compare_arrays(reference_of[value], local, rtol=tolerance.rtol,
                                          atol=tolerance.atol))
        runs.append(_Alone(node, value, np.asarray(local), comparison, members))
    return runs, len(runs) if complete is None else complete


def _named(findings: AttributionFindings, alone: _Alone, runs: Sequence[_Alone], row: Record,
           inner: Mapping[str, CapturedValue], tolerance: Tolerance) -> AttributionFindings:
    """The findings naming ``alone``'s node, with every node's own figure as evidence."""
    comparison = alone.comparison
    figures = LocalFigures(
        introduced_here=True, local_max_abs_error=comparison.max_abs_error,
        local_status=comparison.status, local_nan_mismatch=comparison.nan_mismatch,
        local_exceeds=True, classification=findings.checked[row.onnx_value].classification,
        compute_nodes=(alone.node.name,), isolation=NODE)
    evidence = {**findings.evidence, "narrowed": {
        "segment": list(findings.segment["nodes"]), "node": alone.node.name,
        "alone": {run.node.name: run.comparison.max_abs_error for run in runs},
        "run_with": {run.node.name: [name for name in findings.segment["nodes"]
                                     if name in run.members - {run.node.name}]
                     for run in runs if len(run.members) > 1}}}
    later = tuple(findings.culprits)  # with every culprit asked for: those after the segment
    if alone.value == row.onnx_value:
        checked = {**findings.checked, row.onnx_value: replace(
            findings.checked[row.onnx_value], **{
                name: getattr(figures, name) for name in (
                    "introduced_here", "local_max_abs_error", "local_status",
                    "local_nan_mismatch", "local_exceeds", "compute_nodes", "isolation")})}
        return replace(findings, checked=checked, culprits=(RowRef(row.onnx_value), *later),
                       segment=None, evidence=evidence)
    from bisect_onnx.graph.nodes import node_provenance

    made = make_record(row.index, Pair(inner[alone.value], CapturedValue(
        alone.value, alone.local, node_provenance(alone.node, row.index))), comparison)
    record = replace(made, local=replace(made.local, introduced_here=True,
                                         max_abs_error=comparison.max_abs_error,
                                         status=comparison.status,
                                         nan_mismatch=comparison.nan_mismatch,
                                         classification=figures.classification))
    evidence["inside_kernel"] = {"value": alone.value, "node": alone.node.name,
                                 "kernel_output": row.onnx_value}
    return replace(findings, culprits=(RowRef(alone.value, KERNEL_VALUES), *later),
                   kernel_values=(*findings.kernel_values, record),
                   kernel_checked={**findings.kernel_checked, alone.value: figures},
                   segment=None, evidence=evidence)
