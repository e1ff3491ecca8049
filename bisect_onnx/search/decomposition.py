"""Find the ONNX node that goes wrong inside the segment one FX op was exported to.

The dynamo exporter turns one FX node into several ONNX nodes (``aten.linear`` into
MatMul then Add, ``aten.gelu`` into Div, Erf, Add, Mul, Mul), and only the last output
is named after the FX node. A comparison by name therefore sees a divergence at the
end of the segment, even when its first node is what went wrong.

To look inside, the op is exported again alone (the exporter's own decomposition,
built fresh) on the reference values of its inputs, and run with every value
promoted. Its nodes are paired with the candidate's segment by data flow, from the
op's output back (the two need not be the same node sequence: an optimizer may have
folded a node into a neighbour outside the segment), and the first candidate value
that disagrees with its fresh counterpart, computed from values that agreed, names
the culprit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import BisectOnnxError, one_line
from bisect_onnx.judge.compare import ArrayComparison, compare_arrays
from bisect_onnx.pytorch.op_alone import Slot, Translation, export_alone, single_op
from bisect_onnx.search.program_weights import UnsupportedArgument, weight_of

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["SegmentFinding", "localize_in_segment", "compare_segment", "pair_by_structure",
           "fresh_values_by_file_names", "translate_alone"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentFinding:
    """Which node of an FX op's ONNX segment went wrong first, or why none can be named."""

    node: str | None
    """Name of the first candidate node whose output disagrees; ``None`` if none."""
    value: str | None
    """That node's output value which disagrees."""
    how: str
    """One line: what was done, or why nothing could be said."""
    compared: int
    """How many candidate values were compared with the fresh translation's."""


class _CannotIsolate(Exception):
    """The op cannot be exported alone; the message says why, in one line."""


def localize_in_segment(
    fx_node: torch.fx.Node,
    program: ExportedProgram,
    reference_values: Mapping[str, np.ndarray],
    segment: Sequence[onnx.NodeProto],
    candidate_values: Mapping[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
    opset: int | None = None,
) -> SegmentFinding:
    """Name the first node of ``segment`` whose value differs from the exporter's own translation.

    ``fx_node`` is the failing node of ``program``'s graph; ``reference_values`` hold
    the PyTorch values of its inputs (by FX node name), ``segment`` the candidate's
    nodes made from it in graph order and ``candidate_values`` what those computed
    (by ONNX value name). ``opset`` should be the candidate's. Never raises: when the
    op cannot be exported or run alone, the finding says why.
    """
    compute = [node for node in segment if node.op_type != "Constant"]
    if len(compute) == 1:
        only = compute[0]
        return SegmentFinding(only.name, only.output[0] if only.output else None,
                              how=f"{only.op_type} node {only.name} is the only node of "
                                  f"{fx_node.name}'s segment", compared=0)
    if not compute:
        return SegmentFinding(None, None, how=f"{fx_node.name} has no candidate nodes to look "
                                              "into", compared=0)
    try:
        fresh = translate_alone(fx_node, program, reference_values, opset)
    except (_CannotIsolate, UnsupportedArgument, BisectOnnxError) as error:
        # The export's advice (another exporter, --onnx) is for the user's model, not here.
        reason = one_line(error).split("; ", 1)[0]
        logger.info("cannot look inside %s: %s", fx_node.name, reason)
        return SegmentFinding(None, None, how=f"could not export {fx_node.target} alone: "
                                              f"{reason}", compared=0)
    except Exception as error:  # a refinement of a report must never break the report
        logger.debug("exporting %s alone failed", fx_node.name, exc_info=True)
        return SegmentFinding(None, None, how=f"could not export {fx_node.target} alone: "
                                              f"{type(error).__name__}: {one_line(error)}",
                              compared=0)
    return compare_segment(fx_node, compute, fresh.nodes, fresh.values, reference_values,
                            candidate_values, rtol=rtol, atol=atol)


def compare_segment(
    fx_node: torch.fx.Node,
    compute: Sequence[onnx.NodeProto],
    fresh_nodes: Sequence[onnx.NodeProto],
    fresh_values: Mapping[str, np.ndarray],
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
) -> SegmentFinding:
    """Pair the candidate's nodes with the fresh ones by structure; the first disagreement.

    ``fx_node``: the op (anything with its FX ``name`` and ``target``).
    Long because it is one step: each paired value is compared in the candidate's
    graph order, and the first failing one is named only when every value it was
    computed from inside the segment was compared and agreed.
    """
    op = fx_node.target
    pairs = pair_by_structure(compute, fresh_nodes)
    if not pairs:
        candidate_ops = "-".join(node.op_type for node in compute)
        fresh_ops = "-".join(node.op_type for node in fresh_nodes) or "no nodes"
        return SegmentFinding(None, None, how=(
            f"cannot pair nodes: {op} exported alone is {fresh_ops}, the candidate's "
            f"{fx_node.name} segment is {candidate_ops}, and no node's data flow "
            "matches from the op's output back"), compared=0)
    producers = {value: node for node in compute for value in node.output if value}
    unknown: set[str] = set()  # values not compared: not paired, or not captured
    compared = 0
    for candidate in compute:
        fresh = pairs.get(candidate.name or id(candidate))
        for position, value in enumerate(candidate.output):
            if not value:
                continue  # an optional output left empty
            fresh_value = (fresh.output[position]
                           if fresh is not None and position < len(fresh.output) else None)
            if fresh_value not in fresh_values or value not in candidate_values:
                unknown.add(value)  # it may be where things went wrong
                continue
            comparison = compare_arrays(fresh_values[fresh_value], candidate_values[value],
                                        rtol=rtol, atol=atol)
            compared += 1
            if comparison.passed:
                continue
            before = _unknown_ancestors(candidate, producers, unknown)
            if before:
                return SegmentFinding(None, None, how=(
                    f"{value} is the first compared value of {fx_node.name}'s segment to "
                    f"differ from {op} exported alone, but {', '.join(before)} it is "
                    "computed from could not be compared, so the node cannot be named"),
                    compared=compared)
            return SegmentFinding(candidate.name, value, how=(
                f"{candidate.op_type} node {candidate.name} is the first of {fx_node.name}'s "
                f"segment to differ from {op} exported alone: {value} is "
                f"{_describe_failure(comparison)}"), compared=compared)
    if not compared:
        return SegmentFinding(None, None, how=f"no value of {fx_node.name}'s segment was "
                                              "captured on both sides", compared=0)
    if _output_fails(fx_node.name, reference_values, candidate_values, rtol=rtol, atol=atol):
        how = (f"the candidate's {fx_node.name} segment matches {op} exported alone "
               f"({compared} values agree), yet its output differs from PyTorch: the "
               "exporter's translation of the op, or the runtime, differs from torch")
    else:
        how = (f"all {compared} values of {fx_node.name}'s segment agree with {op} "
               "exported alone")
    return SegmentFinding(None, None, how=how, compared=compared)


def pair_by_structure(
    candidate: Sequence[onnx.NodeProto],
    fresh: Sequence[onnx.NodeProto],
) -> dict[str | int, onnx.NodeProto]:
    """Candidate node (by name, else ``id``) -> the fresh node computing the same thing.

    The two need not have the same node sequence: the candidate's optimizer may
    have folded a Reshape into the one before it, outside the segment (SDPA exported
    alone is Reshape-Transpose-Reshape-Mul-..., inside a MultiheadAttention
    Transpose-Reshape-Mul-...). So pairing starts at the ends, the nodes whose
    outputs nothing else in the segment reads, matched in order, and walks the data
    flow back: two nodes pair when they have the same op type and the nodes they
    read from at each input position pair, until one side's input comes from
    outside its graph or the op types part.
    """
    candidate_producers = {value: node for node in candidate for value in node.output if value}
    fresh_producers = {value: node for node in fresh for value in node.output if value}
    pairs: dict[str | int, onnx.NodeProto] = {}
    taken: set[int] = set()
    stack = list(zip(_ends(candidate), _ends(fresh), strict=False))
    while stack:
        mine, theirs = stack.pop()
        key = mine.name or id(mine)
        if key in pairs or id(theirs) in taken or mine.op_type != theirs.op_type:
            continue
        pairs[key] = theirs
        taken.add(id(theirs))
        for read, fresh_read in zip(mine.input, theirs.input, strict=False):
            source, fresh_source = candidate_producers.get(read), fresh_producers.get(fresh_read)
            if source is not None and fresh_source is not None:
                stack.append((source, fresh_source))
    return pairs


def fresh_values_by_file_names(candidate: Sequence[onnx.NodeProto],
                               fresh: Translation) -> dict[str, np.ndarray]:
    """The op alone's values, each named as the file's node output it pairs with.

    By :func:`pair_by_structure`: what a recording keeps of a look inside an op.
    """
    pairs = pair_by_structure(candidate, fresh.nodes)
    found: dict[str, np.ndarray] = {}
    for node in candidate:
        paired = pairs.get(node.name or id(node))
        for value, theirs in zip(node.output, paired.output if paired is not None else (),
                                 strict=False):
            if value and theirs in fresh.values:
                found[value] = np.asarray(fresh.values[theirs])
    return found


def _ends(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes none of whose outputs another node of ``nodes`` reads, in graph order."""
    read = {value for node in nodes for value in node.input}
    return [node for node in nodes if not any(value in read for value in node.output)]


def _unknown_ancestors(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto],
                       unknown: set[str]) -> list[str]:
    """Values of the segment that ``node`` reads, directly or not, that were not compared.

    The walk stops at compared values: they agreed, so what lies behind them is fine.
    """
    found: list[str] = []
    seen: set[str] = set()
    stack = list(node.input)
    while stack:
        value = stack.pop()
        if value in seen or value not in producers:
            continue  # from outside the segment: the op's inputs
        seen.add(value)
        if value in unknown:
            found.append(value)
            stack.extend(producers[value].input)
    return sorted(found)


def _describe_failure(comparison: ArrayComparison) -> str:
    """``off by up to 0.0154 (status fail)``, or the status alone (``shape mismatch``)."""
    if comparison.max_abs_error is None:
        return comparison.status.replace("_", " ")
    return f"off by up to {comparison.max_abs_error:.3g} (status {comparison.status})"


def _output_fails(name: str, reference_values: Mapping[str, np.ndarray],
                  candidate_values: Mapping[str, np.ndarray], *, rtol: float,
                  atol: float) -> bool:
    """Whether the segment's output (named after the FX node) is off from PyTorch's value."""
    reference = reference_values.get(name)
    candidate = candidate_values.get(name)
    if not isinstance(reference, np.ndarray) or candidate is None:
        return False  # a tuple-valued op, or no value: nothing to say either way
    return not compare_arrays(reference, candidate, rtol=rtol, atol=atol).passed


def translate_alone(
    fx_node: torch.fx.Node,
    program: ExportedProgram,
    reference_values: Mapping[str, np.ndarray],
    opset: int | None,
) -> Translation:
    """Export the op alone with the dynamo exporter, run it on the reference inputs."""
    module, inputs = _isolate(fx_node, program, reference_values)
    return export_alone(module, inputs, exporter="dynamo", opset=opset)


def _isolate(
    fx_node: torch.fx.Node,
    program: ExportedProgram,
    reference_values: Mapping[str, np.ndarray],
) -> tuple[torch.nn.Module, list[np.ndarray]]:
    """A module that calls the op alone, and the arrays to feed its ``forward``.

    Weights stay weights (a parameter, buffer or tensor constant of the module), so
    that the exporter folds them as it did in the whole model; activations become
    inputs, fed with their reference values. Literal arguments stay literal.
    """
    import torch
    from torch.fx.node import map_arg

    if fx_node.op != "call_function":
        raise _CannotIsolate(f"{fx_node.name} is a {fx_node.op} node, not an op call")
    inputs: list[np.ndarray] = []
    input_slots: list[str] = []
    slots: dict[str, Slot] = {}
    weights: dict[str, tuple[str, torch.Tensor]] = {}

    def slot(arg: torch.fx.Node) -> Slot:
        if arg.name in slots:  # the same tensor twice (``mul(x, x)``): one input
            return slots[arg.name]
        name = f"arg_{len(slots)}"
        weight = weight_of(arg, program)
        if weight is None:
            value = reference_values.get(arg.name)
            if value is None:
                raise _CannotIsolate(f"input {arg.name} has no reference value")
            if not isinstance(value, np.ndarray):
                raise _CannotIsolate(f"the reference value of input {arg.name} is a "
                                     f"{type(value).__name__}, not an array")
            inputs.append(value)
            input_slots.append(name)
        else:
            weights[name] = weight
        slots[arg.name] = Slot(name)
        return slots[arg.name]

    module = single_op(fx_node.target, map_arg(tuple(fx_node.args), slot),
                       map_arg(dict(fx_node.kwargs), slot), input_slots)
    for name, (kind, tensor) in weights.items():
        if kind == "parameter":
            module.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
        elif kind == "buffer":
            module.register_buffer(name, tensor)
        else:  # a plain tensor attribute: torch.export lifts it as a constant again
            setattr(module, name, tensor)
    return module.eval(), inputs
