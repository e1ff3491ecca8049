"""Op-level records, and module rows that aggregate the ops inside them.

At op granularity each row is one ATen op's value against the ONNX value it became;
at module granularity each row is a module call's output, and when op records exist
the row also says how many of the call's ops were compared and which failed first:
the module's output is its *last* op, rarely the one that went wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.align.ops import OpAlignment, align_ops
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.judge.findings import Refinement
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.tolerances import Judge, Tolerance
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["GRANULARITIES", "op_records", "align_op_values", "aggregate_ops",
           "look_inside_first_divergence", "named_node"]

logger = logging.getLogger(__name__)

#: ``op``: a row per ATen op (where an ExportedProgram names the ONNX values);
#: ``module``: a row per module call (every model form and exporter).
GRANULARITIES = ("op", "module")


def op_records(alignment: OpAlignment, *, judge: ToleranceJudge) -> list[Record]:
    """One record per op pair, in ONNX graph order, each at its own tolerance."""
    records = []
    for index, pair in enumerate(alignment.pairs):
        provenance = pair.reference.provenance  # the op, and the module call around it
        record = judge.record(index, pair, provenance.fx_node, provenance.module)
        if pair.candidate.name in alignment.matches:
            confidence, how = alignment.matches[pair.candidate.name]
            record = replace(record, match=replace(record.match,
                                                   match_confidence=round(confidence, 3),
                                                   matched_by=how))
        records.append(record)
    return records


def align_op_values(
    ops: OpCapture,
    nodes: Sequence[NodeInfo],
    candidate_values: Mapping[str, CapturedValue],
    *,
    template: onnx.ModelProto | None = None,
    foreign: onnx.ModelProto | None = None,
    foreign_dir: Path | None = None,
    graph_inputs: Mapping[str, np.ndarray] | None = None,
    tolerance: Tolerance,
) -> OpAlignment:
    """By name and metadata; through ``template`` (an export made here) for a foreign file.

    A TorchScript trace's values (``ScriptOpCapture``) are paired by scope, op and order;
    ``foreign`` (the ONNX model) gives the shapes of values the capture left out.
    ``tolerance``: the run's base; a foreign file's value agrees with the template's
    within it.
    """
    from bisect_onnx.pytorch.script_ops import ScriptOpCapture

    if isinstance(ops, ScriptOpCapture):
        from bisect_onnx.align.script_ops import align_script_ops

        return align_script_ops(ops, nodes, candidate_values, foreign)
    if template is None:
        return align_ops(ops, nodes, candidate_values)
    from bisect_onnx.align.foreign import align_foreign

    return align_foreign(template, ops, foreign, foreign_dir or Path("."), candidate_values,
                         graph_inputs or {}, rtol=tolerance.rtol, atol=tolerance.atol)


def aggregate_ops(module_records: Sequence[Record], ops: Sequence[Record],
                  op_pairs: Sequence[Pair]) -> list[Record]:
    """Module records with the counts and first failure of the ops inside each call."""
    scopes = {pair.candidate.name: pair.reference.provenance.scopes for pair in op_pairs}
    inside: dict[str, list[Record]] = {}
    for record in ops:
        for call in scopes.get(record.onnx_value, ()):
            inside.setdefault(call, []).append(record)
    aggregated = []
    for record in module_records:
        members = inside.get(record.torch_module or "", [])
        if not members:
            aggregated.append(record)
            continue
        failing = [member for member in members if member.failed]
        aggregated.append(replace(record, match=replace(
            record.match, ops_compared=len(members), ops_failed=len(failing),
            first_failing_op=failing[0].fx_node if failing else None)))
    return aggregated


def look_inside_first_divergence(
    report: Reading,
    segments: Mapping[str, Sequence[NodeInfo]],
    ops: OpCapture,
    program: ExportedProgram,
    model: onnx.ModelProto,
    candidate_values: Mapping[str, np.ndarray],
    *,
    opset: int | None,
    tolerance: Judge,
) -> Refinement | None:
    """Name the ONNX node inside a multi-node op where the culprit's error starts.

    A failing ``aten.linear`` is MatMul then Add, and only the Add's output carries
    the op's name: the op is exported alone and its values compared node by node
    (:mod:`bisect_onnx.search.decomposition`). The refinement names that node for the
    culprit (else the first divergence), and says what was done either way.
    """
    from bisect_onnx.pytorch.script_ops import ScriptOpCapture
    from bisect_onnx.search.decomposition import localize_in_segment

    if isinstance(ops, ScriptOpCapture):  # a TorchScript trace: no FX program
        from bisect_onnx.align.script_inside import look_inside_script_op

        inside, found = look_inside_script_op(report, segments, ops, model, candidate_values,
                                              opset=opset, tolerance=tolerance)
        return None if inside is None else Refinement(inside_op=inside, node=named_node(found))
    record = report.culprit or report.first_divergence
    if record is None or record.fx_node is None:
        return None
    fx_node = _taken_from(next((node for node in program.graph.nodes
                                if node.name == record.fx_node), None))
    if fx_node is None:
        return None
    segment = [node for node in segments.get(fx_node.name, ())
               if node.op_type != "Constant"]
    if len(segment) < 2:
        return None
    reference = {name: value.array for name, value in ops.values.items()}
    reference.update(ops.graph_inputs)
    finding = localize_in_segment(
        fx_node, program, reference, [model.graph.node[node.index] for node in segment],
        candidate_values, rtol=tolerance.of(record).rtol, atol=tolerance.of(record).atol,
        opset=opset)
    logger.info("inside %s: %s", record.fx_node, finding.how)
    inside = {"fx_node": record.fx_node, "nodes": [node.name for node in segment],
              "node": finding.node, "value": finding.value, "how": finding.how,
              "compared": finding.compared}
    # By the value it computes: a node may have no name in the file.
    found = next((node for node in segment
                  if finding.value is not None and finding.value in node.outputs), None)
    return Refinement(inside_op=inside,
                      node=named_node(found) if finding.node is not None else None)


def _taken_from(fx_node: torch.fx.Node | None) -> torch.fx.Node | None:
    """The op a ``getitem`` takes one output of (an LSTM's), else ``fx_node`` itself.

    The rows of a tuple-valued op are its ``getitem`` nodes; its ONNX nodes (each
    layer's LSTM, Transpose and Reshape) are the op's, so the look inside is the op's.
    """
    import operator

    if (fx_node is not None and fx_node.target is operator.getitem and fx_node.args
            and isinstance(fx_node.args[0], type(fx_node))):
        return fx_node.args[0]
    return fx_node


def named_node(node: NodeInfo | None) -> tuple[str, str] | None:
    """The ``(name, op type)`` a record narrowed to ``node`` takes."""
    return None if node is None else (node.name, node.op_type)
