"""From local checks to the attribution's findings: what each check shows, and no more.

A local check runs a failing value's segment on the reference's exact inputs. What it
shows depends on what ran: one compute node (that node introduces the error), the nodes
of one torch op (that op does), or several ops (only the segment does, and the report
names the segment). :func:`attribution_findings` says which, for every checked value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from bisect_onnx.judge.compare import ArrayComparison, Status
from bisect_onnx.judge.findings import KERNEL_VALUES, AttributionFindings, LocalFigures, RowRef
from bisect_onnx.judge.records import Record
from bisect_onnx.search.attribution import Attribution
from bisect_onnx.search.local import LocalCheck
from bisect_onnx.search.nodeless import NO_ONNX_NODE

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.judge.record_parts import ComparisonFigures
    from bisect_onnx.search.classify import Classification
    from bisect_onnx.search.nodeless import Nodeless

__all__ = ["TorchOps", "attribution_findings", "compute_nodes", "isolation", "exceeds",
           "narrowed_segment", "with_nodeless", "NODE", "OP", "NO_ONNX_NODE"]

NODE = "node"
OP = "op"

#: Ops that compute shapes or constants, never the data a divergence is in.
_SHAPE_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size"})
#: Ops that carry a value to the node that uses it: a quantized node is judged with its
#: quantization pair (what a user acts on is that node, quantized or not).
_CARRIERS = frozenset({"Identity", "QuantizeLinear", "DequantizeLinear"})


def compute_nodes(nodes: Sequence[NodeInfo], indices: Sequence[int]) -> list[NodeInfo]:
    """The nodes among ``indices`` that compute data, not shapes, constants or Q/DQ pairs.

    A node whose every input is a shape or a constant computed in the segment (the
    ``Gather`` and ``Concat`` that build a Reshape's target shape) computes a shape too.
    """
    shape_only: set[str] = set()
    kept = []
    for index in indices:
        node = nodes[index]
        inputs = [name for name in node.inputs if name]
        if node.op_type in _SHAPE_OPS or (inputs and all(name in shape_only
                                                          for name in inputs)):
            shape_only.update(node.outputs)
            continue
        if node.op_type not in _CARRIERS:
            kept.append(node)
    return kept


def isolation(compute: Sequence[NodeInfo],
              op_segments: Mapping[str, Sequence[NodeInfo]] | None = None) -> str | None:
    """What a check of ``compute`` isolates: one node, one torch op, or neither."""
    if len(compute) <= 1:
        return NODE
    made_from = {node.torch.fx_node if node.torch else None for node in compute}
    if len(made_from) == 1 and None not in made_from:
        return OP
    names = {node.name for node in compute}
    for segment in (op_segments or {}).values():
        if names <= {node.name for node in segment}:
            return OP
    return None


def exceeds(local: ArrayComparison | ComparisonFigures | Record | None, atol: float) -> bool:
    """Whether a result is out of its tolerance by a figure the report can state.

    A failing status alone is not enough: the figure printed beside the claim (the
    smallest passing atol, or NaN/Inf in other places) must show it. ``local`` is a
    local run's comparison, or a record's own figures (a value inside a fused kernel,
    judged at its own atol where a rule set one).
    """
    if isinstance(local, Record):
        local = local.figures
    if local is None or local.status == Status.PASS:
        return False
    if local.nan_mismatch or local.status in (Status.SHAPE_MISMATCH, Status.DTYPE_MISMATCH):
        return True
    own = getattr(local, "atol", None)  # a record judged by a rule of its own
    needed = local.min_passing_atol
    return needed is None or math.isinf(needed) or needed > (atol if own is None else own)


@dataclass(frozen=True)
class TorchOps:
    """What tells that a check's nodes are one torch op's, beyond the nodes' own metadata."""

    segments: Mapping[str, Sequence[NodeInfo]] | None = None
    """Op name -> its ONNX nodes: nodes all among one op's are that op's."""
    count: Callable[[str], int | None] | None = None
    """How many torch ops compute a checked value from its segment's inputs (``None``:
    unknown): one, and the segment's nodes are that op's, whatever metadata the file
    lost."""

    def isolation(self, name: str, compute: Sequence[NodeInfo]) -> str | None:
        """What the check of ``name``, which ran ``compute``, isolates (:func:`isolation`)."""
        found = isolation(compute, self.segments)
        # One torch op between the segment's inputs and its value stands for all its nodes
        # only where none of them lacks the metadata the others carry: such a node
        # (inserted by a tool) has no counterpart in that op.
        uniform = len({node.torch is None for node in compute}) <= 1
        if found is None and uniform and self.count is not None and self.count(name) == 1:
            return OP
        return found


#: No op's nodes and no count of ops: only the nodes' own metadata tells.
NO_TORCH_OPS = TorchOps()


def attribution_findings(rows: Sequence[Record], attribution: Attribution,
                         checks: Mapping[str, LocalCheck],
                         kinds: Mapping[str, Classification], nodes: Sequence[NodeInfo], *,
                         atol: float, everything: bool,
                         torch_ops: TorchOps = NO_TORCH_OPS) -> AttributionFindings:
    """The local figures of every checked value, the culprits the checks show, the evidence.

    A first culprit whose check ran several ops is not a culprit: the segment is named
    instead (``segment``), and the later culprits still stand with ``everything``.
    ``torch_ops`` tells a check's nodes to be one torch op's where their metadata does
    not.
    """
    # Several records may share one ONNX value (a module passing its input through):
    # the first of them stands for the value.
    records: dict[str, Record] = {}
    for record in rows:
        records.setdefault(record.onnx_value, record)
    checked: dict[str, LocalFigures] = {}
    op_types: dict[str, dict[str, str]] = {}
    for name, result in attribution.checked.items():
        check, kind = checks.get(name), kinds.get(name)
        local = check.comparison if check else None
        compute = (compute_nodes(nodes, check.segment.nodes)
                   if check is not None and check.segment is not None else [])
        op_types[name] = {node.name: node.op_type for node in compute}
        record_atol = records[name].figures.atol if name in records else None
        checked[name] = LocalFigures(
            introduced_here=None if result is None else result.fails,
            local_max_abs_error=local.max_abs_error if local else None,
            local_status=local.status if local else None,
            local_nan_mismatch=local.nan_mismatch if local else 0,
            local_exceeds=exceeds(local, atol if record_atol is None else record_atol),
            error_growth=_growth(records.get(name), check, records),
            classification=kind.kind if kind else None,
            compute_nodes=tuple(node.name for node in compute),
            isolation=torch_ops.isolation(name, compute))
    culprits = [RowRef(name) for name in attribution.culprits]
    segment = None
    if culprits and checked[culprits[0].value].isolation is None:
        segment = _segment(checks[culprits[0].value], checked[culprits[0].value],
                           op_types[culprits[0].value])
        culprits = culprits[1:] if everything else []
    first = attribution.culprit
    evidence = {
        "noise": attribution.noise,
        "drift": attribution.drift,
        "largest_jump": attribution.largest_jump,
        "checked": len(attribution.checked),
        "inputs": dict(checks[first].segment.inputs) if first and checks[first].segment
        else None,
        "nodes": checks[first].nodes if first else None,
        "classification": _describe(kinds.get(first)) if first else None,
        "unchecked": {name: checks[name].reason for name, result in attribution.checked.items()
                      if result is None and name in checks},
        "narrowed": None,  # set where a segment's node is named by its run alone
        "passed_alone": None,  # set where none is, to the nodes whose runs agreed
        "baked_shapes": None,  # set where the export baked the shapes it was made at
    }
    return AttributionFindings(checked=checked, culprits=tuple(culprits),
                               listed_all=everything, evidence=evidence, segment=segment)


def narrowed_segment(nodes: Sequence[NodeInfo], indices: Sequence[int],
                     compute: Sequence[NodeInfo],
                     inner: Record) -> dict[str, Any]:
    """The part of a failing segment that computes ``inner`` from values that pass.

    ``indices``: the segment's nodes since the last value PyTorch has that passes.
    """
    computed = {output for index in indices for output in nodes[index].outputs}
    entering = [name for index in indices for name in nodes[index].inputs
                if name and name not in computed]
    return {"from": list(dict.fromkeys(entering)), "to": inner.onnx_value,
            "nodes": [node.name for node in compute],
            "ops": {node.name: node.op_type for node in compute},
            "local_max_abs_error": inner.figures.max_abs_error,
            "local_nan_mismatch": inner.figures.nan_mismatch}


def with_nodeless(findings: AttributionFindings, found: Nodeless, first: Record,
                  classified: Mapping[str, Any], *, atol: float) -> AttributionFindings:
    """The findings with a PyTorch computation that has no ONNX node as the culprit.

    The first failing value's own check is left undecided: it was fed PyTorch's value
    before that computation, not what its torch op read.
    """
    record = found.record
    checked = dict(findings.checked)
    if first.onnx_value in checked:
        checked[first.onnx_value] = replace(checked[first.onnx_value], introduced_here=None)
    figures = LocalFigures(
        introduced_here=True, local_max_abs_error=record.figures.max_abs_error,
        local_status=record.figures.status, local_nan_mismatch=record.figures.nan_mismatch,
        local_exceeds=exceeds(record, atol), isolation=NO_ONNX_NODE)
    evidence = {**findings.evidence, "classification": dict(classified), "inside_kernel": None,
                "nodeless": {"value": record.onnx_value, "module": record.torch_module,
                             "op": record.torch_op, "before": found.before}}
    return replace(findings, checked=checked, culprits=(RowRef(record.onnx_value,
                                                               KERNEL_VALUES),),
                   kernel_values=(record,), kernel_checked={record.onnx_value: figures},
                   segment=None, evidence=evidence)


def _segment(check: LocalCheck, figures: LocalFigures,
             op_types: Mapping[str, str]) -> dict[str, Any]:
    """The segment a check ran, as the report names it."""
    return {"from": list(check.segment.inputs) if check.segment else [],
            "to": check.value, "nodes": list(figures.compute_nodes), "ops": dict(op_types),
            "local_max_abs_error": figures.local_max_abs_error,
            "local_nan_mismatch": figures.local_nan_mismatch}


def _growth(record: Record | None, check: LocalCheck | None,
            records: Mapping[str, Record]) -> float | None:
    """How much the error grew from the node's inputs to its output (max abs, as a ratio)."""
    if (record is None or check is None or check.segment is None
            or record.figures.max_abs_error is None):
        return None
    upstream = [records[name].figures.max_abs_error for name in check.segment.inputs
                if name in records and records[name].figures.max_abs_error is not None]
    worst = max(upstream, default=0.0)
    return None if worst == 0 else record.figures.max_abs_error / worst


def _describe(kind: Classification | None) -> dict[str, Any] | None:
    return asdict(kind) if kind is not None else None
