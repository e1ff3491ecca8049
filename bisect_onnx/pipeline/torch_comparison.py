"""The PyTorch form's comparison: align module and op values, compare, decide.

One sample's captures in, its report out (before the search and attribution steps
add to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Alignment, Pair, Unaligned, align_modules
from bisect_onnx.align.op_level import aggregate_ops, op_records
from bisect_onnx.align.ops import OpAlignment
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.reach import feeding
from bisect_onnx.graph.scopes import count_attributed, detect_exporter
from bisect_onnx.graph.walk import subgraphs
from bisect_onnx.judge.compare import ArrayComparison, compare_arrays
from bisect_onnx.judge.findings import ComparisonFindings
from bisect_onnx.judge.records import Coverage, Record, make_record
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.judge.verdict import Decision, decide, identical_values
from bisect_onnx.judge.vocabulary import ReportWarning
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import Capture, CapturedValue

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.pipeline.torch_sample import TorchSample

__all__ = ["OpScope", "compare_torch_sample", "compare_final_outputs", "decide_sample",
           "subgraph_warnings", "ANOTHER_MODEL", "FOREIGN_FILE", "NOTHING_ALIGNED", "NO_OP_LEVEL",
           "vacuity_warnings", "is_vacuity"]

FOREIGN_FILE = ReportWarning(
    "foreign-file",
    "the ONNX file carries no exporter metadata (renamed by another tool, or built "
    "elsewhere): its values were matched by structure to an export made here, each match "
    "with a confidence (matched_by, match_confidence); check the match of the first "
    "divergence"
)

ANOTHER_MODEL = ReportWarning(
    "another-model",
    "the ONNX file is not this model's export: {why}; compare the model with its own "
    "export (let bisect-onnx export it, or pass the file exported from these weights)")

NOTHING_ALIGNED = ReportWarning(
    "nothing-aligned",
    "no intermediate value could be aligned: only the final outputs were compared, which "
    "says nothing about where a divergence starts")

NO_OP_LEVEL = ReportWarning(
    "no-op-level",
    "op granularity needs the graph the exporter translated: the dynamo exporter's "
    "ExportedProgram (an export made here, an ONNXProgram, a .pt2), or for a TorchScript "
    "file a trace of the nn.Module (or a scripted model without control flow, inputs "
    "passed by position); compared at module level"
)


@dataclass(frozen=True)
class OpScope:
    """Op values for one module call only: its rows are ops, the rest module calls."""

    call: str
    """The call whose ops were traced (``layer3.4``)."""
    values: frozenset[str]
    """The ONNX values its nodes compute: their module rows give way to op rows."""
    boundary: list[Pair] = field(default_factory=list)
    """What enters the call, PyTorch's value against the ONNX value (exact inputs for
    the local checks of its first ops; no rows of their own)."""


def subgraph_warnings(model: onnx.ModelProto) -> list[str]:
    """Say that values inside If/Loop/Scan bodies were not compared, only their outputs."""
    holders = [node.name or node.op_type for node in model.graph.node
               if any(next(subgraphs(attribute), None) is not None
                      for attribute in node.attribute)]
    if not holders:
        return []
    return [f"values inside the subgraphs of {len(holders)} node(s) ({', '.join(holders[:5])}"
            f"{', …' if len(holders) > 5 else ''}) are not promotable and were not compared: "
            "those nodes are compared at the subgraph boundary, by their outputs"]


def compare_torch_sample(
    sample: TorchSample,
    op_alignment: OpAlignment | None,
    *,
    warnings: list[str],
    granularity: str,
    op_scope: OpScope | None = None,
) -> tuple[ComparisonFindings, list[Pair], dict[str, list[NodeInfo]]]:
    """Align, compare and decide one sample: its findings, its pairs, the ops' segments.

    The sample's PyTorch values against its runtime's (``onnx_capture``), the final
    outputs as judged. At op granularity the module rows are skipped: their comparisons
    are the costly part. With ``op_scope`` (op values of one call only) the rows are
    that call's ops and the other module calls.
    """
    torch_capture, onnx_capture, candidate = (sample.torch_capture, sample.onnx_capture,
                                              sample.candidate)
    call_index, judge = sample.settings.prepared.call_index, sample.settings.judge
    torch_ops = len(sample.ops.values) if sample.ops else 0
    final_outputs = list(sample.final_outputs)
    alignment = align_modules(torch_capture, candidate.nodes, onnx_capture.values,
                              call_index=call_index)
    pairs = sorted(alignment.pairs, key=lambda pair: (
        pair.candidate.provenance.position, pair.reference.provenance.position))
    op_rows = op_records(op_alignment, judge=judge) if op_alignment else []
    unaligned, onnx_unaligned = alignment.unaligned, []
    if granularity == "op" and op_alignment is not None and op_scope is not None:
        comparisons, pairs, unaligned = _scoped_rows(pairs, op_rows, op_alignment, op_scope,
                                                     alignment.unaligned, judge)
        onnx_unaligned = op_alignment.onnx_only
    elif granularity == "op" and op_alignment is not None:
        # Module rows an op row stands for are not shown (the costly part); one whose value
        # no op row holds stays: op level never drops what module level compares.
        comparisons, pairs = _op_rows_and_the_rest(pairs, op_rows, op_alignment.pairs, judge)
        unaligned, onnx_unaligned = op_alignment.torch_only, op_alignment.onnx_only
    else:
        comparisons = _module_rows(pairs, judge)
        if op_alignment is not None:
            comparisons = aggregate_ops(comparisons, op_rows, op_alignment.pairs)
            onnx_unaligned = op_alignment.onnx_only
    decision = decide_sample(comparisons, final_outputs, onnx_capture, candidate)
    if detect_exporter(candidate.nodes) == "unknown" and not pairs:
        warnings.append(
            "the ONNX graph carries neither torch exporter metadata nor TorchScript-style "
            "node names, so no layer could be aligned: only the final outputs were "
            "compared (let bisect-onnx export the model, or pass the exporter's own file)"
        )
    elif not pairs and alignment.module_calls:
        warnings.append(NOTHING_ALIGNED)
    warnings.extend(judge.unused_warnings())
    findings = ComparisonFindings.decided(
        decision,
        rtol=judge.base.rtol,
        atol=judge.base.atol,
        final_outputs=final_outputs,
        comparisons=comparisons,
        coverage=replace(_coverage(alignment, op_alignment, pairs, onnx_capture, candidate,
                                   granularity, torch_ops),
                         op_scope=op_scope.call if op_scope and op_alignment else None),
        unaligned=unaligned,
        onnx_unaligned=onnx_unaligned,
        op_comparisons=op_rows if granularity == "module" else [],
        warnings=warnings,
        tolerance_basis=sample.settings.tolerance_basis,
    )
    return findings, pairs, op_alignment.segments if op_alignment else {}


def _scoped_rows(pairs: Sequence[Pair], op_rows: Sequence[Record], op_alignment: OpAlignment,
                 scope: OpScope, unaligned: Sequence[Unaligned], judge: ToleranceJudge):
    """Op rows inside the call, module rows outside it, in graph order (renumbered).

    A module row whose value the call computes (an enclosing call ending with it) gives
    way to the op row of that value; the rows' pairs, and what enters the call, are the
    pairs returned.
    """
    outside = [pair for pair in pairs if pair.candidate.name not in scope.values]
    module_rows = aggregate_ops(_module_rows(outside, judge), op_rows, op_alignment.pairs)
    rows = sorted([(pair.candidate.provenance.position, 1, pair, row)
                   for pair, row in zip(outside, module_rows, strict=True)]
                  + [(pair.candidate.provenance.position, 0, pair, row)
                     for pair, row in zip(op_alignment.pairs, op_rows, strict=True)],
                  key=lambda item: item[:2])
    path = scope.call.partition("@")[0]
    kept = [item for item in unaligned if not (item.name == scope.call
                                                or item.name.startswith(path + "."))]
    return ([replace(row, index=index) for index, (_, _, _, row) in enumerate(rows)],
            [pair for _, _, pair, _ in rows] + list(scope.boundary),
            [*kept, *op_alignment.torch_only])


def _op_rows_and_the_rest(module_pairs: Sequence[Pair], op_rows: Sequence[Record],
                          op_pairs: Sequence[Pair], judge: ToleranceJudge,
                          ) -> tuple[list[Record], list[Pair]]:
    """Op rows, and the module rows of values no op row holds, in graph order.

    A kept module row is named by its module call, not by an op its value maps to.
    """
    covered = {pair.candidate.name for pair in op_pairs}
    kept: dict[str, Pair] = {}  # one row per value: the first call that holds it
    for pair in module_pairs:
        if pair.candidate.name not in covered and pair.candidate.name not in kept:
            call = replace(pair.reference, provenance=replace(pair.reference.provenance,
                                                              fx_node=None))
            kept[pair.candidate.name] = Pair(call, pair.candidate)
    kept = list(kept.values())
    if not kept:
        return list(op_rows), list(op_pairs)
    rows = sorted([(pair.candidate.provenance.position, 0, pair, row)
                   for pair, row in zip(op_pairs, op_rows, strict=True)]
                  + [(pair.candidate.provenance.position, 1, pair, row)
                     for pair, row in zip(kept, _module_rows(kept, judge), strict=True)],
                  key=lambda item: item[:2])
    return ([replace(row, index=index) for index, (_, _, _, row) in enumerate(rows)],
            [pair for _, _, pair, _ in rows])


def _module_rows(pairs: Sequence[Pair], judge: ToleranceJudge) -> list[Record]:
    """One record per module call, each at its own tolerance.

    Nested module calls often hold the same value (a block's output is its last ReLU's):
    the same array against the same ONNX value is compared once.
    """
    compared: dict[tuple[int, str, Tolerance], ArrayComparison] = {}
    rows = []
    for index, pair in enumerate(pairs):
        tolerance = judge.tolerance(pair.candidate.name, pair.reference.name)
        key = (id(pair.reference.array), pair.candidate.name, tolerance)
        if key not in compared:
            compared[key] = compare_arrays(pair.reference.array, pair.candidate.array,
                                           rtol=tolerance.rtol, atol=tolerance.atol)
        rows.append(judge.mark(make_record(index, pair, compared[key]), tolerance))
    return rows


def _coverage(alignment: Alignment, op_alignment: OpAlignment | None, pairs: Sequence[Pair],
              onnx_capture: Capture, candidate: Runner, granularity: str,
              torch_ops: int) -> Coverage:
    coverage = Coverage(
        onnx_values=len(onnx_capture.values),
        aligned_values=len({pair.candidate.name for pair in pairs}),
        torch_modules=alignment.module_calls,
        aligned_modules=alignment.aligned_calls,
        onnx_nodes=len(candidate.nodes),
        attributed_nodes=count_attributed(candidate.nodes),
        granularity=granularity,
    )
    if op_alignment is None:
        return coverage
    return replace(
        coverage,
        attributed_nodes=coverage.attributed_nodes + len(op_alignment.inferred),
        inferred_nodes=len(op_alignment.inferred),
        torch_ops=torch_ops,
        compared_ops=len(op_alignment.pairs),
        fused_ops=len(op_alignment.fused_into),
        fx_named_values=op_alignment.fx_named_values,
        fx_named_compared=op_alignment.fx_named_compared,
    )


def compare_final_outputs(
    torch_outputs: Sequence[CapturedValue],
    onnx_outputs: Sequence[CapturedValue],
    *,
    judge: ToleranceJudge,
    warnings: list[str],
) -> list[Record]:
    """The final outputs, always compared, aligned or not (pairs by position)."""
    if len(torch_outputs) != len(onnx_outputs):
        warnings.append(
            f"PyTorch returned {len(torch_outputs)} tensor output(s) and the ONNX graph has "
            f"{len(onnx_outputs)}: only the first {min(len(torch_outputs), len(onnx_outputs))} "
            "were compared"
        )
    records = [judge.record(index, Pair(ref, cand), final=True)
               for index, (ref, cand) in enumerate(zip(torch_outputs, onnx_outputs,
                                                       strict=False))]
    warnings.extend(vacuity_warnings(torch_outputs, records, atol=judge.base.atol))
    return records


VACUOUS_EMPTY = "vacuous-empty"
VACUOUS_SMALL = "vacuous-small"


def decide_sample(comparisons: Sequence[Record], final_outputs: Sequence[Record],
                  capture: Capture, candidate: Runner) -> Decision:
    """The verdict on a sample's rows: outputs taken in graph order, and what feeds them."""
    return decide(comparisons, final_outputs, output_order={
        name: value.provenance.position for name, value in capture.values.items()},
        feeding=partial(feeding, candidate.view, model=candidate.model,
                        settled=identical_values(comparisons)))


def vacuity_warnings(references: Sequence[CapturedValue], records: Sequence[Record], *,
                     atol: float) -> list[ReportWarning]:
    """Parity that says nothing, said: outputs with no element, or all below ``atol``.

    When every reference output is smaller than the absolute tolerance, any candidate
    output as small passes (zeros included), whatever the graph computes.
    """
    if not records or any(record.failed for record in records):
        return []
    arrays = [np.asarray(value.array) for value in references[:len(records)]]
    if all(array.size == 0 for array in arrays):
        return [ReportWarning(VACUOUS_EMPTY, "every final output is empty (zero-size inputs?), "
                              "so no element was compared and parity says nothing; pass "
                              "inputs with at least one element")]
    tolerances = [atol if record.figures.atol is None else record.figures.atol
                  for record in records]
    filled = [(array, tol) for array, tol in zip(arrays, tolerances, strict=True) if array.size]
    if not all(array.dtype.kind in "fc" for array, _ in filled):
        return []  # integer and boolean outputs compare exactly: they say something
    magnitudes = [(float(np.max(np.abs(array[np.isfinite(array)]), initial=0.0)), tol)
                  for array, tol in filled]
    largest = max(magnitude for magnitude, _ in magnitudes)
    if all(magnitude < tol for magnitude, tol in magnitudes):
        return [ReportWarning(VACUOUS_SMALL, f"the largest final output value is "
                              f"{largest:.3g}, below atol={max(tolerances):g}: any ONNX output "
                              "that small passes (zeros too), so parity is meaningless here; "
                              f"lower the atol well below {largest:.3g}")]
    return []


def is_vacuity(warning: object) -> bool:
    """Whether a warning says that parity holds only vacuously."""
    return getattr(warning, "code", None) in (VACUOUS_EMPTY, VACUOUS_SMALL)
