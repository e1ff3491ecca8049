"""A node with no counterpart in the reference, as the culprit of a failing segment.

A tool or a hand edit inserts a node (a ``Mul`` after a ``ReduceMean``): its output has
no reference value, so the local check of the value after it runs it together with its
consumer, and no single node is shown to fail. Taken through as the reference takes
it (its output fed the reference's value of its input, the value its consumer's
counterpart read), the segment passes: the inserted node introduced the error, and its
consumer only inherited it. Polygraphy's mark-all comparison names the consumer here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.compare import Status, compare_arrays
from bisect_onnx.judge.findings import KERNEL_VALUES, AttributionFindings, LocalFigures, RowRef
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.claims import exceeds
from bisect_onnx.search.local import LocalCheck, LocalRerun

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["UNPAIRED", "unpaired_culprit", "narrow_to_unpaired", "inserted_classification",
           "exporters_node"]

#: The isolation of a culprit that is a node the reference has no counterpart of.
UNPAIRED = "no counterpart"

def inserted_classification() -> dict[str, Any]:
    """What the verdict says of a node with no counterpart: whoever added it."""
    return {"kind": "graph edit", "detail": "the node has no counterpart in the reference: "
            "taken through, the values after it agree",
            "file_with": "remove or fix the inserted node (a graph tool's rewrite or a hand "
            "edit added it)", "torch_vs_onnx64": None, "ort_error": None, "torch_error": None}


def exporters_node(node: NodeInfo) -> bool:
    """Whether a node is the exporter's: dynamo metadata, or a TorchScript scope name."""
    return node.torch is not None or node.name.startswith("/")


def unpaired_culprit(segment: Mapping[str, Any], check: LocalCheck,
                     references: Mapping[str, np.ndarray],
                     candidate_values: Mapping[str, np.ndarray], rerun: LocalRerun, index: int,
                     has_counterpart: Callable[[NodeInfo], bool]) -> Record | None:
    """The node of ``segment`` with no counterpart that alone explains its failure, if any.

    ``check``: the segment value's local check (what each node computed from exact
    inputs); ``references``: the reference's values by ONNX name, values inside the
    segment included where the reference has them; ``has_counterpart``: whether the
    reference has the node (the exporter made it, or the reference graph holds it).
    ``rerun``: local checks of the runner's values, judged at its tolerance.
    """
    tolerance, model = rerun.tolerance, rerun.runner.model
    initializers = {tensor.name for tensor in model.graph.initializer}
    by_name = {node.name: node for node in rerun.runner.nodes}
    for name in segment["nodes"]:
        node = by_name.get(name)
        if node is None or len(node.outputs) != 1 or has_counterpart(node):
            continue
        data = [value for value in node.inputs if value and value not in initializers]
        output = node.outputs[0]
        if output in references and output != check.value:
            continue  # the reference computes its value: it has a counterpart
        # (The checked value's reference is what the node's consumers read: paired
        # with the segment's output, whichever node of the segment computed it.)
        # Its input as the reference has it, else as the segment computed it from the
        # reference's values (inside an op PyTorch holds no value of, a GroupNorm's
        # InstanceNormalization): taken through on either, what follows must agree.
        before = (references.get(data[0], check.values.get(data[0])) if len(data) == 1
                  else None)
        computed = check.values.get(output)
        if (before is None or computed is None or np.shape(before) != np.shape(computed)
                or np.asarray(before).dtype != np.asarray(computed).dtype):
            continue  # another shape or type (a Cast): its consumers cannot read its input
        changes = compare_arrays(before, computed, rtol=tolerance.rtol, atol=tolerance.atol)
        if changes.status == Status.PASS:
            continue  # it hands its input on: not what changes the data
        if not _agrees_without(check, output, before, references, candidate_values,
                               tolerance, rerun):
            continue  # still fails without it: not the one to blame
        record = make_record(index, Pair(
            CapturedValue(data[0], np.asarray(before), Provenance(position=index)),
            CapturedValue(output, np.asarray(computed), Provenance(
                position=index, node=node.name, node_op=node.op_type))), changes)
        return replace(record, torch_module=None, torch_op=None, source=None, fx_node=None,
                       match=replace(record.match, reference_value=data[0]))
    return None


def _agrees_without(check: LocalCheck, output: str, before: np.ndarray,
                    references: Mapping[str, np.ndarray],
                    candidate_values: Mapping[str, np.ndarray], tolerance: Tolerance,
                    rerun: LocalRerun) -> bool:
    """Whether the checked value agrees with the node taken through (its input handed on).

    The checked value itself is judged (the segment may have been narrowed inside it):
    the one whose reference the run's judge knows. Where the node is the segment's last
    (its input fused with it in one kernel or layer, so no value before it was
    captured), its input is that value as the node would have handed it on.
    """
    if output == check.value:
        reference = references.get(output)
        return reference is not None and np.shape(reference) == np.shape(before) and (
            compare_arrays(reference, before, rtol=tolerance.rtol,
                           atol=tolerance.atol).status == Status.PASS)
    taken_through = rerun([check.value],
                          reference_values={**references, output: np.asarray(before)},
                          candidate_values={**candidate_values,
                                            output: np.asarray(check.values[output])})
    result = taken_through[check.value].comparison
    return result is not None and result.status == Status.PASS


def narrow_to_unpaired(findings: AttributionFindings, check: LocalCheck | None,
                       references: Mapping[str, np.ndarray],
                       candidate_values: Mapping[str, np.ndarray], rerun: LocalRerun,
                       index: int, has_counterpart: Callable[[NodeInfo], bool] = exporters_node,
                       ) -> AttributionFindings:
    """The findings with a segment's node that has no counterpart as the culprit.

    Unchanged where the findings name no segment, or no such node explains it.
    """
    if findings.segment is None or findings.culprits or check is None:
        return findings
    record = unpaired_culprit(findings.segment, check, references, candidate_values, rerun,
                              index, has_counterpart)
    if record is None:
        return findings
    figures = LocalFigures(introduced_here=True, local_max_abs_error=record.figures.max_abs_error,
                           local_status=record.figures.status,
                           local_nan_mismatch=record.figures.nan_mismatch,
                           local_exceeds=exceeds(record, rerun.tolerance.atol),
                           compute_nodes=(record.onnx_node,), isolation=UNPAIRED)
    evidence = {**findings.evidence, "classification": inserted_classification(),
                "unpaired": {"node": record.onnx_node, "value": record.onnx_value,
                             "reads": record.match.reference_value,
                             "fed": "reference" if record.match.reference_value in references
                             else "segment"}}
    # The segment's own check ran the inserted node too: what it says of its last value is
    # not decided by it (taken through, that value agrees).
    checked = dict(findings.checked)
    if check.value in checked:
        checked[check.value] = replace(checked[check.value], introduced_here=None)
    return replace(findings, checked=checked,
                   culprits=(RowRef(record.onnx_value, KERNEL_VALUES),),
                   kernel_values=(*findings.kernel_values, record),
                   kernel_checked={**findings.kernel_checked, record.onnx_value: figures},
                   segment=None, evidence=evidence)
