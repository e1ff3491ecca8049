"""Inside a multi-node op of a TorchScript export: which of its nodes goes wrong first.

The TorchScript exporter turns ``aten::linear`` into MatMul then Add, ``aten::gelu``
into Div, Erf, Add, Mul, Mul, and ``scaled_dot_product_attention`` into a dozen nodes
around a Softmax; op-level alignment pairs the op's value with the last of them. To
name the node that went wrong, the traced op is called alone (its weights as
parameters, its activations as inputs holding PyTorch's values), exported with the
same exporter and opset, and run with every value promoted. Its nodes are paired with
the candidate's by data flow (:func:`bisect_onnx.search.decomposition.pair_by_structure`),
and the first candidate value that differs from its fresh counterpart, computed from
values that agreed, names the node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.script_table import END_OF
from bisect_onnx.errors import BisectOnnxError, one_line
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.tolerances import Judge
from bisect_onnx.pytorch.op_alone import Slot, Translation, export_alone, single_op
from bisect_onnx.pytorch.script_ops import ScriptOp, ScriptOpCapture
from bisect_onnx.runtime.sides import CapturedValue, JsonObject

if TYPE_CHECKING:
    import onnx
    import torch

    from bisect_onnx.judge.records import Record

__all__ = ["look_inside_script_op", "references_by_onnx_value", "script_inside_values"]

logger = logging.getLogger(__name__)


def references_by_onnx_value(segments: Mapping[str, Sequence[NodeInfo]],
                             ops: ScriptOpCapture, nodes: Sequence[NodeInfo] = (),
                             opset: int | None = None) -> dict[str, CapturedValue]:
    """PyTorch's op values by the ONNX value each op ends in, fused-away ones included.

    Not where that value feeds a node the exporter did not make (``nodes``: the graph's)
    and the op's translation may go on past it: a node inserted inside the op (a Mul
    between a Linear's MatMul and Add) cuts its segment short, and the value the segment
    ends in is then not the op's. An op of one node (an ``add``) ends in its value
    whatever reads it next, and so does one paired by the exporter's record of it at
    ``opset`` (the file's): it was paired with the record's last node. With them, the
    values of ops made from sizes or weights alone where the file computes them
    (``constant_references``).
    """
    from bisect_onnx.search.inserted import exporters_node

    foreign_inputs = {name for node in nodes if not exporters_node(node) for name in node.inputs}
    kinds = {op.name: op.kind for op in ops.ops}
    paired = {segment[-1].outputs[0]: ops.values[name] for name, segment in segments.items()
              if segment and segment[-1].outputs and name in ops.values
              and (segment[-1].outputs[0] not in foreign_inputs
                   or not (_may_go_on(kinds.get(name, ""))
                           and (opset is None or ops.records.of(name, opset) is None)))}
    return {**ops.constant_references, **paired}


def _may_go_on(kind: str) -> bool:
    """Whether an op's translation may have nodes after the one its table entry names."""
    end = END_OF.get(kind.split("::", 1)[-1])
    return end is None or bool(end.then)


def look_inside_script_op(report: Reading, segments: Mapping[str, Sequence[NodeInfo]],
                          ops: ScriptOpCapture, model: onnx.ModelProto,
                          candidate_values: Mapping[str, np.ndarray], *,
                          opset: int | None, tolerance: Judge,
                          ) -> tuple[JsonObject | None, NodeInfo | None]:
    """What was done inside the culprit's op, and the node where its error starts.

    ``(None, None)`` where nothing was looked at; the node is ``None`` where none can
    be named.
    """
    record = report.culprit or report.first_divergence
    culprit = _culprit_op(record, segments, ops)
    if culprit is None:
        return None, None
    op, segment = culprit
    node, value, how = _localize(op, ops, [model.graph.node[item.index] for item in segment],
                                 candidate_values, rtol=tolerance.of(record).rtol,
                                 atol=tolerance.of(record).atol,
                                 opset=opset)
    logger.info("inside %s: %s", op.name, how)
    inside: JsonObject = {"fx_node": op.name, "nodes": [item.name for item in segment],
                          "node": node, "value": value, "how": how}
    found = next((item for item in segment if value is not None and value in item.outputs),
                 None)
    return inside, found if node is not None else None


def script_inside_values(record: Record, segments: Mapping[str, Sequence[NodeInfo]],
                         ops: ScriptOpCapture, model: onnx.ModelProto, *,
                         opset: int | None) -> dict[str, np.ndarray]:
    """What the look inside ``record``'s op computes in PyTorch, by the file's value names.

    The op exported alone again (the look inside keeps nothing) and run on PyTorch's
    values, each value under the name of the file's node output it pairs with by
    structure: a recording keeps them, so that a check where PyTorch is not compares
    inside the op too. Empty where the look inside cannot be made.
    """
    from bisect_onnx.search.decomposition import fresh_values_by_file_names

    culprit = _culprit_op(record, segments, ops)
    if culprit is None:
        return {}
    op, segment = culprit
    try:
        alone = _translate_alone(op, ops, opset)
    except Exception:  # as the look inside itself: what cannot be exported is not kept
        logger.debug("exporting %s alone failed", op.name, exc_info=True)
        return {}
    return fresh_values_by_file_names([model.graph.node[item.index] for item in segment],
                                      alone)


def _culprit_op(record: Record | None, segments: Mapping[str, Sequence[NodeInfo]],
                ops: ScriptOpCapture) -> tuple[ScriptOp, list[NodeInfo]] | None:
    """The traced op ``record`` names and its nodes, where it is one of several nodes."""
    if record is None or record.fx_node is None:
        return None
    segment = [node for node in segments.get(record.fx_node, ()) if node.op_type != "Constant"]
    op = next((op for op in ops.ops if op.name == record.fx_node), None)
    if len(segment) < 2 or op is None:
        return None
    return op, segment


def _localize(op: ScriptOp, ops: ScriptOpCapture, segment: Sequence[onnx.NodeProto],
              candidate_values: Mapping[str, np.ndarray], *, rtol: float, atol: float,
              opset: int | None) -> tuple[str | None, str | None, str]:
    """(node, value, how): the first node of ``segment`` to differ from ``op`` alone."""
    from bisect_onnx.search.decomposition import pair_by_structure

    try:
        alone = _translate_alone(op, ops, opset)
    except BisectOnnxError as error:
        # The export's advice (another exporter, --onnx) is for the user's model, not here.
        return None, None, (f"could not export {op.kind} alone: "
                            f"{one_line(error).split('; ', 1)[0]}")
    except Exception as error:  # a refinement of a report must never break the report
        logger.debug("exporting %s alone failed", op.name, exc_info=True)
        return None, None, (f"could not export {op.kind} alone: {type(error).__name__}: "
                            f"{one_line(error)}")
    fresh_values = alone.values
    pairs = pair_by_structure(segment, alone.nodes)
    producers = {value: node for node in segment for value in node.output if value}
    unknown: set[str] = set()
    for node in segment:
        fresh = pairs.get(node.name or id(node))
        for position, value in enumerate(node.output):
            theirs = fresh.output[position] if fresh is not None else None
            if theirs not in fresh_values or value not in candidate_values:
                unknown.add(value)
                continue
            comparison = compare_arrays(fresh_values[theirs], candidate_values[value],
                                        rtol=rtol, atol=atol)
            if comparison.passed:
                continue
            agreeing = _agreeing_inputs(node, fresh, fresh_values, candidate_values,
                                        rtol=rtol, atol=atol)
            before = _unknown_reads(node, producers, unknown - agreeing)
            if before:
                return None, None, (f"{value} is the first value of {op.name}'s nodes to "
                                    f"differ from {op.kind} exported alone, but "
                                    f"{', '.join(before)} before it could not be compared")
            return node.name, value, (f"{node.op_type} node {node.name} is the first of "
                                      f"{op.name}'s nodes to differ from {op.kind} exported "
                                      f"alone (off by up to {comparison.max_abs_error:.3g})")
    return None, None, f"every compared value of {op.name}'s nodes agrees with {op.kind} alone"


def _agreeing_inputs(node: onnx.NodeProto, fresh: onnx.NodeProto | None,
                     fresh_values: Mapping[str, np.ndarray],
                     candidate_values: Mapping[str, np.ndarray], *, rtol: float,
                     atol: float) -> set[str]:
    """The inputs of ``node`` that equal its fresh counterpart's, input by input.

    A GRU's zero state is an Expand of a shape in the file and an initializer alone:
    no node of the one pairs with the other's, but the GRU reads the same value.
    """
    if fresh is None:
        return set()
    return {value for value, theirs in zip(node.input, fresh.input, strict=False)
            if value in candidate_values and theirs in fresh_values
            and compare_arrays(fresh_values[theirs], candidate_values[value],
                               rtol=rtol, atol=atol).passed}


def _unknown_reads(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto],
                   unknown: set[str]) -> list[str]:
    """Values of the segment ``node`` reads, directly or through others, never compared."""
    found, seen, stack = [], set(), list(node.input)
    while stack:
        value = stack.pop()
        if value in seen or value not in producers or value not in unknown:
            continue
        seen.add(value)
        found.append(value)
        stack.extend(producers[value].input)
    return sorted(found)


def _translate_alone(op: ScriptOp, ops: ScriptOpCapture, opset: int | None) -> Translation:
    """Export ``op`` alone with the TorchScript exporter; its nodes and every value."""
    import torch

    if op.arguments is None:
        raise BisectOnnxError(f"an argument of {op.name} is computed in the graph, not a "
                              "value, weight or literal")
    inputs: list[np.ndarray] = []
    positional: list[object] = []
    keywords: dict[str, object] = {}
    weights: dict[str, torch.Tensor] = {}
    for index, argument in enumerate(op.arguments):
        if argument.source == "value":
            held = ops.values.get(argument.value)
            inputs.append(held.array if held is not None else ops.graph_inputs[argument.value])
            item: object = Slot(f"input_{len(inputs) - 1}")
        elif argument.source == "weight" and isinstance(argument.value, list):
            # A recurrent op's weights, one list: each its own buffer.
            item = [Slot(f"weight_{index}_{number}") for number in range(len(argument.value))]
            weights.update({slot.name: tensor for slot, tensor in zip(item, argument.value,
                                                                      strict=True)})
        elif argument.source == "weight":
            weights[f"weight_{index}"] = argument.value
            item = Slot(f"weight_{index}")
        else:
            item = argument.value
        if argument.keyword is None:
            positional.append(item)
        else:
            keywords[argument.keyword] = item
    module = single_op(getattr(torch.ops.aten, op.kind.split("::", 1)[-1]), positional,
                       keywords, [f"input_{number}" for number in range(len(inputs))])
    for name, tensor in weights.items():
        module.register_buffer(name, tensor)
    return export_alone(module, inputs, exporter="torchscript", opset=opset)
