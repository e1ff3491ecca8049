"""Pair PyTorch module calls with the ONNX values that hold the same tensor.

Module level, for graphs made by the dynamo exporter. Each ONNX node's metadata
lists the module paths enclosing it (``name_scopes``); a module call's output is the
value produced last by the nodes of that call. Folded BatchNorm needs no special
case here: the exporter gives the fused Conv node the BatchNorm's metadata, so the
fused output belongs to the BatchNorm and the Conv module simply has no node.

A module called several times (one ``self.relu`` used three times) gives all its
calls the same scope. When the ExportedProgram is at hand, its ``nn_module_stack``
keys (``relu``, ``relu@1``, ...) say which call each FX node belongs to. Otherwise
the calls are told apart by graph order: the distinct FX nodes of the module are
split into as many equal runs as there were calls, and a module whose count does
not divide is left unaligned rather than guessed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bisect_onnx.onnx_side import NodeInfo
from bisect_onnx.sides import Capture, CapturedValue

__all__ = ["Pair", "Unaligned", "Alignment", "CallIndex", "align_modules"]

#: ``call_index[fx_node][module_path]`` = which call of the module the FX node ran in.
CallIndex = Mapping[str, Mapping[str, int]]

NO_NODE = (
    "no ONNX node carries this module's scope "
    "(fused into a neighbour, folded away, or identity-like)"
)
NO_METADATA = (
    "the ONNX graph carries no torch exporter metadata (not a dynamo export, or stripped "
    "by another tool), so module outputs cannot be located"
)


@dataclass(frozen=True)
class Pair:
    """A reference value and the candidate value that should hold the same tensor."""

    reference: CapturedValue
    candidate: CapturedValue


@dataclass(frozen=True)
class Unaligned:
    """A reference value with no candidate counterpart, and why."""

    name: str
    reason: str


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
    calls: dict[tuple[str, int], list[CapturedValue]] = defaultdict(list)
    for value in reference.values.values():
        calls[(value.provenance.module or "", value.provenance.call)].append(value)
    calls_per_module = Counter(module for module, _ in calls)
    alignment = Alignment(module_calls=len(calls))

    if not any(node.torch for node in nodes):
        alignment.unaligned = [Unaligned(vs[0].name, NO_METADATA) for vs in calls.values()]
        return alignment

    groups, ambiguous = _group_nodes_by_call(nodes, calls_per_module, call_index)
    consumers = _consumers(nodes)
    for (module, call), values in calls.items():
        group = groups.get((module, call))
        if not group:
            reason = ambiguous.get(module, NO_NODE)
            alignment.unaligned.extend(Unaligned(value.name, reason) for value in values)
        elif len(values) == 1:
            candidate = _module_output(group, values[0], candidate_values)
            if candidate is None:
                alignment.unaligned.append(Unaligned(values[0].name, NO_NODE))
            else:
                alignment.pairs.append(Pair(values[0], candidate))
        else:
            _align_several_outputs(group, values, candidate_values, consumers, alignment)
    return alignment


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
    for value in values:
        matches = [
            candidate for candidate in leaving
            if candidate.array.shape == value.array.shape
            and candidate.array.dtype == value.array.dtype
        ]
        if len(matches) == 1:
            alignment.pairs.append(Pair(value, matches[0]))
        else:
            what = "no value" if not matches else f"{len(matches)} values"
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
    calls_per_module: Mapping[str, int],
    call_index: CallIndex | None,
) -> tuple[dict[tuple[str, int], list[NodeInfo]], dict[str, str]]:
    """Group nodes by (module path, call), and say why for modules that cannot be."""
    members: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        if node.torch:
            for scope in node.torch.scopes:
                if scope:  # "" is the model itself, compared through its final outputs
                    members[scope].append(node)

    groups: dict[tuple[str, int], list[NodeInfo]] = defaultdict(list)
    ambiguous: dict[str, str] = {}
    for module, module_nodes in members.items():
        count = calls_per_module.get(module, 0)
        if count == 0:
            continue
        known = _calls_from_index(module, module_nodes, call_index) if call_index else None
        if known is not None:
            for node, call in zip(module_nodes, known, strict=True):
                groups[(module, call)].append(node)
            continue
        origins = list(dict.fromkeys(node.torch.fx_node for node in module_nodes if node.torch))
        if len(origins) % count:
            ambiguous[module] = (
                f"{len(origins)} exported ops for {count} calls of a reused module: "
                "cannot tell which call each op belongs to"
            )
            continue
        per_call = len(origins) // count
        call_of = {origin: position // per_call for position, origin in enumerate(origins)}
        for node in module_nodes:
            groups[(module, call_of[node.torch.fx_node])].append(node)
    return groups, ambiguous


def _calls_from_index(
    module: str, module_nodes: Sequence[NodeInfo], call_index: CallIndex
) -> list[int] | None:
    """Each node's call of ``module`` from the ExportedProgram, or ``None`` if any is unknown."""
    calls = []
    for node in module_nodes:
        fx_node = node.torch.fx_node if node.torch else None
        call = call_index.get(fx_node, {}).get(module) if fx_node else None
        if call is None:
            return None
        calls.append(call)
    return calls


def _module_output(
    group: Sequence[NodeInfo],
    reference: CapturedValue,
    candidate_values: Mapping[str, CapturedValue],
) -> CapturedValue | None:
    """The value produced last within a module call.

    Of the last node's outputs, the one shaped like the reference is taken (a
    LayerNormalization may also output its mean); otherwise its first output.
    """
    for node in reversed(group):
        produced = [candidate_values[name] for name in node.outputs if name in candidate_values]
        if not produced:
            continue
        for value in produced:
            if (value.array.shape == reference.array.shape
                    and value.array.dtype == reference.array.dtype):
                return value
        return produced[0]
    return None
