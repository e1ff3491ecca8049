"""Pair PyTorch module calls with the ONNX values that hold the same tensor.

Module level. :mod:`bisect_onnx.graph.scopes` says which modules enclose each ONNX node
(from the dynamo exporter's metadata or the TorchScript exporter's node names); a
module call's output is the value produced last by the nodes of that call.

A module called several times (one ``self.relu`` used three times) gives all its
calls the same scope. When the ExportedProgram is at hand, its ``nn_module_stack``
keys (``relu``, ``relu@1``, ...) say which call each node belongs to. Otherwise the
calls are told apart by graph order: the module's ops are split into as many equal
runs as there were calls, accepted only when every run has the same op types; a
module that does not split that way is left unaligned rather than guessed.

Two exporter habits need a rule each:

- BatchNorm folded into the preceding Conv. The dynamo exporter gives the fused node
  the BatchNorm's metadata, so it simply belongs to the BatchNorm. The TorchScript
  exporter keeps the *Conv's* name on it although its output is the BatchNorm's: a
  BatchNorm call with no node of its own, right after a Conv call, takes that node.
- Modules that return their input unchanged (eval-mode Dropout, ``nn.Identity``) have
  no node: they are compared at the value they passed through.

What enters a call (``fc2 (input)``) is paired with the value its nodes read from
outside it (:mod:`bisect_onnx.align.module_inputs`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_onnx.align.module_inputs import entering_pairs
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import NodeScope, read_scopes
from bisect_onnx.pytorch.calls import input_of, split_into_calls
from bisect_onnx.runtime.sides import Capture, CapturedValue

__all__ = ["Pair", "Unaligned", "Alignment", "CallIndex", "align_modules", "nodes_of_calls"]

#: ``call_index[fx_node][module_path]`` = which call of the module the FX node ran in.
CallIndex = Mapping[str, Mapping[str, int]]

NO_NODE = (
    "no ONNX node carries this module's scope "
    "(fused into a neighbour, folded away, or identity-like)"
)
NO_METADATA = (
    "the ONNX graph carries neither torch exporter metadata nor TorchScript-style scoped "
    "node names (built elsewhere, or renamed by another tool), so module outputs cannot "
    "be located"
)

NOT_CAPTURED = (
    "the module's output is not among the captured values (inside a kernel the runtime "
    "fused, with fusion-preserving capture; --promote all compares it)"
)
TRANSPOSED = (
    "the last value the module's nodes compute holds its output's dimensions in another "
    "order (the exporter folded the module's closing transpose into one after it): it is "
    "not the module's output"
)
RESHAPED = (
    "the last value the module's nodes compute holds its output's elements in another shape "
    "(the exporter merged the module's closing reshape with one after it): it is not the "
    "module's output"
)
FOLDED_INTO_BATCHNORM = (
    "folded with the BatchNorm that follows it into one ONNX Conv, whose output is the "
    "BatchNorm's (compared there)"
)

CallKey = tuple[str, int]


@dataclass(frozen=True)
class Pair:
    """A reference value and the candidate value that should hold the same tensor."""

    reference: CapturedValue
    candidate: CapturedValue


@dataclass(frozen=True)
class Unaligned:
    """A value of one side with no counterpart on the other, and why."""

    name: str
    reason: str
    kind: str = "module"
    """What sort of value it is, for grouping: ``module`` (a module output), or at op
    level ``fused``, ``runtime-fused``, ``removed``, ``folded``, ``layout``,
    ``intermediate``, ``foreign``, ``not-probed`` (over the memory budget),
    and for a file of unknown origin ``unmatched`` and ``ambiguous``."""


@dataclass
class Alignment:
    """The result of aligning one reference capture with one candidate graph."""

    pairs: list[Pair] = field(default_factory=list)
    unaligned: list[Unaligned] = field(default_factory=list)
    module_calls: int = 0
    """Number of module calls the reference recorded."""

    @property
    def aligned_calls(self) -> int:
        """Number of module calls paired with a candidate value."""
        calls = {(pair.reference.provenance.module, pair.reference.provenance.call)
                 for pair in self.pairs}
        return len(calls)


def align_modules(
    reference: Capture,
    nodes: Sequence[NodeInfo],
    candidate_values: Mapping[str, CapturedValue],
    *,
    call_index: CallIndex | None = None,
) -> Alignment:
    """Pair each recorded module call's output with the ONNX value it became."""
    calls: dict[CallKey, list[CapturedValue]] = defaultdict(list)
    entering: dict[CallKey, list[CapturedValue]] = defaultdict(list)
    for value in reference.values.values():
        key = (value.provenance.module or "", value.provenance.call)
        (entering if input_of(value.name) else calls)[key].append(value)
    alignment = Alignment(module_calls=len(calls))

    scopes = read_scopes(nodes, {module for module, _ in calls}, call_index)
    if not any(scopes):
        alignment.unaligned = [Unaligned(vs[0].name, NO_METADATA) for vs in calls.values()]
        return alignment

    calls_per_module = Counter(module for module, _ in calls)
    groups, reasons = _group_nodes_by_call(nodes, scopes, calls_per_module)
    # What enters a call is read by its own nodes: a BatchNorm given the folded Conv
    # reads the Conv's input, not its own.
    own_groups = dict(groups)
    _give_folded_conv_to_batchnorm(calls, groups, reasons)
    consumers = _consumers(nodes)
    reshapes = {node.index for node in nodes if node.op_type in _RESHAPES}
    paired: dict[str, CapturedValue] = {}  # reference name -> candidate
    for key, values in calls.items():
        group = groups.get(key)
        passed_through = values[0].provenance.same_as if len(values) == 1 else None
        if not group and passed_through in paired:
            candidate = paired[passed_through]
            alignment.pairs.append(Pair(values[0], candidate))
            paired[values[0].name] = candidate
        elif not group:
            reason = reasons.get(key) or reasons.get(key[0]) or NO_NODE
            alignment.unaligned.extend(Unaligned(value.name, reason) for value in values)
        elif len(values) == 1:
            candidate = _module_output(group, values[0], candidate_values)
            if candidate is None:
                alignment.unaligned.append(Unaligned(values[0].name, NOT_CAPTURED))
            elif _permuted(candidate.array.shape, values[0].array.shape):
                alignment.unaligned.append(Unaligned(values[0].name, TRANSPOSED))
            elif _reshaped(candidate, values[0].array, consumers, reshapes):
                alignment.unaligned.append(Unaligned(values[0].name, RESHAPED))
            else:
                alignment.pairs.append(Pair(values[0], candidate))
                paired[values[0].name] = candidate
        else:
            _align_several_outputs(group, values, candidate_values, consumers, alignment)
    held: dict[str, list[CapturedValue]] = defaultdict(list)
    for pair in alignment.pairs:
        held[pair.candidate.name].append(pair.reference)
    alignment.pairs.extend(Pair(reference, candidate) for reference, candidate in entering_pairs(
        entering, own_groups, candidate_values, held, nodes))
    return alignment


def nodes_of_calls(reference: Capture, nodes: Sequence[NodeInfo], *,
                   call_index: CallIndex | None = None) -> dict[CallKey, list[NodeInfo]]:
    """Each recorded module call's ONNX nodes, grouped as :func:`align_modules` groups them.

    Calls whose nodes cannot be told from another call's (see there) are left out.
    """
    calls = {(value.provenance.module or "", value.provenance.call)
             for value in reference.values.values() if not input_of(value.name)}
    scopes = read_scopes(nodes, {module for module, _ in calls}, call_index)
    groups, _ = _group_nodes_by_call(nodes, scopes, Counter(module for module, _ in calls))
    return dict(groups)


def _give_folded_conv_to_batchnorm(
    calls: Mapping[CallKey, Sequence[CapturedValue]],
    groups: dict[CallKey, list[NodeInfo]],
    reasons: dict[CallKey | str, str],
) -> None:
    """Hand a Conv's node to the BatchNorm folded into it, and say why the Conv has none.

    Hooks fire in call order, so a BatchNorm applied to a Conv's output is the very
    next call. The fused node computes the BatchNorm's output: comparing it with the
    Conv's would be a false alarm at the first block.
    """
    keys = list(calls)
    for previous, key in zip(keys, keys[1:], strict=False):
        conv_class = calls[previous][0].provenance.module_class or ""
        norm_class = calls[key][0].provenance.module_class or ""
        if not (norm_class.startswith("BatchNorm") and conv_class.startswith("Conv")):
            continue
        conv_nodes, norm_nodes = groups.get(previous), groups.get(key)
        if not norm_nodes and conv_nodes and conv_nodes[-1].op_type == "Conv":
            groups[key] = groups.pop(previous)  # TorchScript: the node has the Conv's name
            reasons[previous] = FOLDED_INTO_BATCHNORM
        elif not conv_nodes and norm_nodes and norm_nodes[-1].op_type == "Conv":
            reasons[previous] = FOLDED_INTO_BATCHNORM  # dynamo: it has the BatchNorm's


def _align_several_outputs(
    group: Sequence[NodeInfo],
    values: Sequence[CapturedValue],
    candidate_values: Mapping[str, CapturedValue],
    consumers: Mapping[str, set[int]],
    alignment: Alignment,
) -> None:
    """Pair a module's several tensor outputs (an attention's output and weights, say).

    The candidates are the values that leave the call (used outside it, or not at
    all); each output is paired with the one candidate of its shape and dtype, and
    left unaligned when there is none or more than one: order says nothing here.
    """
    inside = {node.index for node in group}
    leaving = []
    for node in group:
        for name in node.outputs:
            readers = consumers.get(name, set())
            if name in candidate_values and (not readers or not readers <= inside):
                leaving.append(candidate_values[name])

    def kind(value: CapturedValue) -> tuple[tuple[int, ...], np.dtype]:
        return value.array.shape, value.array.dtype

    # An LSTM returns its last hidden and cell states alike; the file may keep only
    # one of them: a shape that two outputs share tells neither.
    alike = Counter(kind(value) for value in values)
    for value in values:
        matches = [candidate for candidate in leaving if kind(candidate) == kind(value)]
        if len(matches) == 1 and alike[kind(value)] == 1:
            alignment.pairs.append(Pair(value, matches[0]))
            continue
        what = ("no value" if not matches else f"{len(matches)} values" if len(matches) > 1
                else f"one value for its {alike[kind(value)]} outputs")
        alignment.unaligned.append(Unaligned(
            value.name,
            f"the module returns {len(values)} tensors and {what} of this one's shape "
            "and dtype leave the call: cannot tell which is which",
        ))


def _consumers(nodes: Sequence[NodeInfo]) -> dict[str, set[int]]:
    """Value name -> indices of the nodes that read it."""
    readers: dict[str, set[int]] = defaultdict(set)
    for node in nodes:
        for name in node.inputs:
            readers[name].add(node.index)
    return readers


def _group_nodes_by_call(
    nodes: Sequence[NodeInfo],
    scopes: Sequence[NodeScope | None],
    calls_per_module: Mapping[str, int],
) -> tuple[dict[CallKey, list[NodeInfo]], dict[CallKey | str, str]]:
    """Group nodes by (module path, call), and say why for modules that cannot be."""
    members: dict[str, list[tuple[NodeInfo, NodeScope]]] = defaultdict(list)
    for node, scope in zip(nodes, scopes, strict=True):
        if scope is not None:
            for module in scope.modules:
                members[module].append((node, scope))

    groups: dict[CallKey, list[NodeInfo]] = defaultdict(list)
    reasons: dict[CallKey | str, str] = {}
    for module, module_members in members.items():
        count = calls_per_module.get(module, 0)
        if count == 0:
            continue
        known = [scope.calls.get(module) for _, scope in module_members]
        # Recorded calls are used when they account for every call and nothing else (a
        # TorchScript name without a suffix is only presumed to be a first call).
        if None not in known and set(known) == set(range(count)):
            for (node, _), call in zip(module_members, known, strict=True):
                groups[(module, call)].append(node)
            continue
        split = split_into_calls(module_members, count, origin=lambda m: m[1].origin,
                                 kind=lambda m: m[0].op_type)
        if split is None:
            reasons[module] = (
                f"a module called {count} times whose ops do not split into {count} alike "
                "runs in graph order: cannot tell which call each op belongs to (an "
                "export made here with the dynamo exporter records the calls)"
            )
            continue
        for call, run in enumerate(split):
            groups[(module, call)].extend(node for node, _ in run)
    return groups, reasons


def _permuted(shape: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether two shapes hold the same dimensions in another order."""
    return shape != other and sorted(shape) == sorted(other)


#: Nodes that hold their input's elements in another shape.
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def _reshaped(candidate: CapturedValue, reference: np.ndarray,
              consumers: Mapping[str, set[int]], reshapes: set[int]) -> bool:
    """Whether the candidate holds the reference's elements in another shape.

    Only where a reshape reads it: the module's closing reshape, merged into the next
    module's. Any other shape is compared (and fails by shape): an exporter's bug.
    """
    array = candidate.array
    return (array.shape != reference.shape and array.size == reference.size
            and bool(consumers.get(candidate.name, set()) & reshapes))


def _module_output(
    group: Sequence[NodeInfo],
    reference: CapturedValue,
    candidate_values: Mapping[str, CapturedValue],
) -> CapturedValue | None:
    """The value produced last within a module call.

    Of the last node's outputs, the one shaped like the reference is taken (a
    LayerNormalization may also output its mean); otherwise its first output. When
    the last node's outputs were not captured (inside a kernel ONNX Runtime fused),
    an earlier value is *not* taken: it would be another tensor.
    """
    for node in reversed(group):
        if node.op_type == "Constant":
            continue
        produced = [candidate_values[name] for name in node.outputs if name in candidate_values]
        if not produced:
            return None
        for value in produced:
            if (value.array.shape == reference.array.shape
                    and value.array.dtype == reference.array.dtype):
                return value
        return produced[0]
    return None
