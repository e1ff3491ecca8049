"""Computations PyTorch runs that the ONNX graph has no node for, as culprits.

A Dropout left in training mode, an op the trace dropped: PyTorch changes the data
there and the ONNX graph, having no node for it, hands its input on. A local check
cannot see this: it feeds the failing value's nodes the reference's value *by ONNX
name*, which is PyTorch's value before the computation, and compares with PyTorch's
value after it, so the innocent nodes fail. The torch values tell it: the computation
changes its input beyond tolerance, and ONNX's value equals PyTorch's before it.
Then that computation is the culprit, named by its module and op, with no ONNX node.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import read_scopes
from bisect_onnx.judge.compare import Status, compare_arrays
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.pytorch.calls import input_of
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.align.modules import CallIndex
    from bisect_onnx.search.evidence import Evidence
    from bisect_onnx.search.local import LocalCheck

__all__ = ["Nodeless", "NO_ONNX_NODE", "nodeless_culprit", "at_module_level", "at_op_level",
           "fx_span", "nodeless_classification"]

#: An output's place in a call's tuple or dict output (``attn[0]``, ``out[logits]``).
_OUTPUT_INDEX = re.compile(r"(\[[^\]]*\])+$")

#: The isolation of a culprit that is a PyTorch computation with no ONNX node.
NO_ONNX_NODE = "no ONNX node"

#: Past this many ops the torch side of a segment is not followed: a segment that long
#: is a module call or a cut, not one op.
MAX_SPAN = 64


@dataclass(frozen=True)
class Nodeless:
    """A computation PyTorch ran that ONNX has no node for, and that changed the data."""

    record: Record
    """ONNX's value (the computation's input, handed on) against PyTorch's output of it."""
    before: str
    """PyTorch's value the computation changed (which ONNX's value equals)."""
    training: bool
    """The computation is a mode-dependent module (Dropout, BatchNorm) in training mode."""


def nodeless_classification(found: Nodeless) -> dict[str, Any]:
    """What the verdict says of it: which side differs, and what to do."""
    module = found.record.torch_module or "the model"
    if found.training:
        return {"kind": "pytorch mode", "detail": f"{module} runs in training mode in "
                "PyTorch; the export is in eval mode and has no node for it",
                "file_with": f"PyTorch's side differs: call model.eval() (or {module}.eval()) "
                "before comparing", "torch_vs_onnx64": None, "ort_error": None,
                "torch_error": None}
    return {"kind": "missing in the export", "detail": f"PyTorch changes the value in "
            f"{module}, and the ONNX graph has no node for it (a branch or op the trace "
            "left out, an identity-like export)",
            "file_with": "file it with the exporter (pytorch/pytorch, label \"module: onnx\"), "
            "or fix the model so that the export keeps the computation",
            "torch_vs_onnx64": None, "ort_error": None, "torch_error": None}


def at_module_level(first: Record, values: Mapping[str, CapturedValue],
                    candidates: Mapping[str, np.ndarray], tolerance: Tolerance,
                    training: Collection[str],
                    computed_in: Collection[str] | None) -> Nodeless | None:
    """A module call ONNX has no node for, whose output the failing ``first`` row reads.

    Its output is what ``first`` compares (a module row handed it on), or what
    ``first``'s module read (an op row inside it). ``values``: PyTorch's module
    capture; ``candidates``: ONNX's values that may stand for the call's input (the row's
    own, and its check's inputs). ONNX's value equal to the call's input where PyTorch
    reads its output shows that the graph has no node for it, whatever the alignment,
    unless the failing check's own nodes compute the call: ``computed_in`` holds the
    modules they run in (``None`` where a node's module is unknown, an inserted node's
    say, and then no call is claimed missing). A Conv the exporter fused with the
    BatchNorm after it is the Conv module's node, though it is paired with the norm.
    """
    if computed_in is None:
        return None
    read = [values[name].array for name in (first.torch_module or "",
                                            f"{first.torch_module} (input)")
            if name in values]
    calls = [name for name in values if input_of(name) is None
             and f"{name} (input)" in values and name != first.torch_module]
    for name in calls:
        if _computes(computed_in, name.partition("@")[0]):
            continue
        output, entering = values[name], values[f"{name} (input)"]
        if not any(np.array_equal(output.array, array, equal_nan=True) for array in read):
            continue
        # Named as the module call it is, not after an op the capture mapped it to.
        call = CapturedValue(output.name, output.array,
                             replace(output.provenance, fx_node=None))
        for onnx_name, array in candidates.items():
            candidate = CapturedValue(onnx_name, np.asarray(array), replace(
                call.provenance, node=None, node_op=None))
            found = _changed_here(entering, call, candidate, tolerance, first.index,
                                  name.partition("@")[0] in training)
            if found is not None:
                return found
    return None


def at_op_level(first: Record, program: ExportedProgram, op_values: Mapping[str, CapturedValue],
                inputs: Mapping[str, str], candidate_values: Mapping[str, np.ndarray],
                has_nodes: Collection[str], tolerance: Tolerance,
                training: Collection[str]) -> Nodeless | None:
    """Ops between the failing op's checked inputs and it that ONNX has no node for.

    The failing op read a value (``getitem`` of a ``native_dropout``, say) that ops with
    no ONNX node made from one of the checked segment's inputs. ``inputs``: the
    segment's ONNX inputs -> the FX names they stand for; ``has_nodes``: the FX names
    that have ONNX nodes.
    """
    span = fx_span(program, first.fx_node, set(inputs.values())) if first.fx_node else None
    if not span:
        return None
    in_span = {node.name for node in span}
    op = next(node for node in span if node.name == first.fx_node)
    for read in op.all_input_nodes:
        output = op_values.get(read.name)
        if read.name not in in_span or read.name in has_nodes or output is None:
            continue
        # Only the checked inputs ``read`` is made from, through ops with no ONNX node: a
        # weight-only op (a permute of a parameter, folded into an initializer) reaches
        # none, and explains nothing.
        sources = _made_from(read, set(inputs.values()), has_nodes)
        for onnx_name, fx_name in inputs.items():
            if fx_name not in sources:
                continue
            entering = op_values.get(fx_name)
            if entering is None or onnx_name not in candidate_values:
                continue
            candidate = CapturedValue(onnx_name, np.asarray(candidate_values[onnx_name]),
                                      output.provenance)
            module = output.provenance.scopes[-1] if output.provenance.scopes else ""
            found = _changed_here(entering, output, candidate, tolerance, first.index,
                                  module in training)
            if found is not None:
                return found
    return None


def nodeless_culprit(first: Record, check: LocalCheck | None, fx_names: Mapping[str, str],
                     candidate_values: Mapping[str, np.ndarray], evidence: Evidence, *,
                     tolerance: Tolerance, nodes: Sequence[NodeInfo]) -> Nodeless | None:
    """A computation ONNX has no node for, where it explains ``first``'s failing ``check``.

    At op level through the program's ops (``evidence.ops``; ``evidence.op_segments``:
    those with ONNX nodes), else through the module calls (``evidence.modules``: the
    module capture and its call index); ``evidence.training``: the modules left in
    training mode. ``fx_names``: ONNX value -> the FX name it was paired with;
    ``nodes``: the candidate's top-level nodes.
    """
    if check is None or check.comparison is None or check.comparison.status == Status.PASS:
        return None
    program, ops, modules = evidence.program, evidence.ops, evidence.modules
    op_segments, training = evidence.op_segments, evidence.training
    if ops is not None and program is not None and check.segment is not None:
        inputs = {name: fx_names.get(name, name) for name in check.segment.inputs}
        return at_op_level(first, program, ops.values, inputs, candidate_values,
                           set(op_segments or ()), tolerance, training)
    if ops is None and modules is not None:
        names = [first.onnx_value, *(check.segment.inputs if check.segment else ())]
        candidates = {name: candidate_values[name] for name in names
                      if name in candidate_values}
        return at_module_level(first, modules[0].values, candidates, tolerance, training,
                               modules_computing(check.nodes, nodes, modules[0].values,
                                                 modules[1]))
    return None


#: Nodes that compute nothing a module call could be missing for.
_NO_COMPUTATION = frozenset({"Constant"})


def modules_computing(names: Collection[str], nodes: Sequence[NodeInfo],
                      values: Mapping[str, CapturedValue],
                      call_index: CallIndex | None) -> set[str] | None:
    """The modules the nodes ``names`` run in, by their scopes; ``None`` where one is unknown.

    ``values``: the module capture (its names give the module paths the scopes resolve
    against). A node with no scope, or one whose scope does not resolve to modules
    PyTorch called, may compute anything.
    """
    chosen = [node for node in nodes if node.name in set(names)
              and node.op_type not in _NO_COMPUTATION]
    paths = {_OUTPUT_INDEX.sub("", name).partition("@")[0] for name in values
             if input_of(name) is None}
    modules: set[str] = set()
    for scope in read_scopes(chosen, paths, call_index):
        if scope is None or not scope.complete:
            return None
        modules.update(scope.modules)
    return modules


def _computes(modules: Collection[str], path: str) -> bool:
    """Whether a node in ``modules`` runs in module ``path`` (or in one of its children)."""
    return any(module == path or module.startswith(f"{path}.") for module in modules)


def _made_from(node: torch.fx.Node, frontier: set[str], has_nodes: Collection[str]) -> set[str]:
    """The ``frontier`` values ``node`` is computed from through ops with no ONNX node.

    Empty where the walk meets an op that has ONNX nodes first (then that op, not a
    missing one, stands between).
    """
    reached, stack, seen = set(), [node], set()
    while stack:
        current = stack.pop()
        for source in current.all_input_nodes:
            if source.name in seen:
                continue
            seen.add(source.name)
            if source.name in frontier:
                reached.add(source.name)
            elif source.op == "call_function":
                if source.name in has_nodes:
                    return set()
                stack.append(source)
    return reached


def _changed_here(entering: CapturedValue, output: CapturedValue, candidate: CapturedValue,
                  tolerance: Tolerance, index: int, training: bool) -> Nodeless | None:
    """The computation from ``entering`` to ``output``, where it alone explains the failure.

    It changes its input beyond tolerance, and ONNX's value equals its input.
    """
    if (entering.array.shape != output.array.shape
            or candidate.array.shape != entering.array.shape):
        return None
    rtol, atol = tolerance.rtol, tolerance.atol
    if compare_arrays(entering.array, output.array, rtol=rtol, atol=atol).status == Status.PASS:
        return None  # it hands its input on: not where the data changes
    if compare_arrays(entering.array, candidate.array, rtol=rtol,
                      atol=atol).status != Status.PASS:
        return None  # ONNX already differs before it: the error is upstream
    against = compare_arrays(output.array, candidate.array, rtol=rtol, atol=atol)
    return Nodeless(make_record(index, Pair(output, candidate), against), entering.name,
                    training)


def fx_span(program: ExportedProgram, output: str,
            frontier: set[str]) -> list[torch.fx.Node] | None:
    """The ops that compute ``output`` from ``frontier``'s values, in graph order.

    ``None`` where the walk leaves the program or passes :data:`MAX_SPAN` ops.
    """
    nodes = {node.name: node for node in program.graph.nodes}
    order = {name: index for index, name in enumerate(nodes)}
    span: set[str] = set()
    stack = [output]
    while stack:
        name = stack.pop()
        if name in span or (name in frontier and name != output):
            continue
        node = nodes.get(name)
        if node is None:
            return None
        if node.op != "call_function":
            continue  # an input or a weight: read directly
        span.add(name)
        if len(span) > MAX_SPAN:
            return None
        stack.extend(source.name for source in node.all_input_nodes)
    return sorted((nodes[name] for name in span), key=lambda node: order[node.name])
