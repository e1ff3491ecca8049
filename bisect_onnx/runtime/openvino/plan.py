"""Which values to make outputs so that OpenVINO still executes production's layers.

Making a value an output changes what OpenVINO compiles: a Convolution whose residual
input is an output can no longer add into that buffer in place (Conv+Add+Relu becomes
a Convolution and an Eltwise), a scale folded into a FullyConnected moves out of it,
and a value handed out as float32 makes its bf16 layer write float32. So:

1. production is compiled, and its executed layers read
   (:mod:`bisect_onnx.runtime.openvino.layers`);
2. the candidates are the values leaving each layer (the outputs of its ONNX nodes
   that a node outside the layer reads), each asked for in its layer's output
   precision (bf16 stays bf16);
3. values production's layers alone say would break them are left out from the start:
   a Convolution's residual added in place (a ResNet shortcut: made an output, its
   buffer cannot be overwritten, and the Add runs as a layer of its own), an attention
   Subgraph's Transposes (they split off), and where a FullyConnected holds an
   operation OpenVINO made itself (a scale folded into its weights) the values it hands
   out and the Reshapes and Transposes after it, across which the scale was moved;
4. the capture is compiled and its layers compared with production's, signature by
   signature (type, runtime precision, output precisions, the ONNX nodes and
   OpenVINO's own operations fused in). On BERT-base and ResNet-50 they are
   production's in this first compilation. Where a layer is lost, a first guess: its
   residual added in place, else the values its own nodes hand out (and the layout
   after a folded scale). Those are dropped and the capture compiled again (the guess
   is kept: trying its values back would cost a compilation each);
5. Where it does not, the values touching each layer still lost are dropped (its
   inputs and outputs first, then a node further each round), until the layers are
   production's, and the dropped values are then tried back, every changed layer's
   group in the same compilation: a fusion is broken near the value that breaks it,
   so a layer changed again is blamed on the groups near it, which are halved
   (within :data:`MAX_RESTORES` compilations).

What stays dropped is inside production's fusions as far as the capture can tell:
such a value is pinned by running its nodes locally on reference values (as for ONNX
Runtime's fused kernels). A plan that cannot reach production's layers within
:data:`MAX_ROUNDS` keeps nothing: the capture is then production itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from bisect_onnx.graph.view import GraphView
from bisect_onnx.runtime.openvino.layers import (
    LAYOUT_OPS,
    ExecutedLayer,
    blank_numbers,
)
from bisect_onnx.runtime.openvino.sessions import NARROW_TYPES

if TYPE_CHECKING:
    import openvino as ov

    from bisect_onnx.runtime.sides import JsonObject

__all__ = ["OpenVinoPlan", "plan_capture", "leaving_values", "same_layers", "MAX_ROUNDS"]

logger = logging.getLogger(__name__)

#: Compilations of the capture before giving up on keeping any value but the outputs.
MAX_ROUNDS = 8
#: Compilations spent trying dropped values back (a group at a time).
MAX_RESTORES = 24


@dataclass
class OpenVinoPlan:
    """What the capture asks for, and how it compares with production."""

    production_layers: list[ExecutedLayer]
    candidates: list[str]
    """Every value leaving an executed layer (what a capture would ask for first)."""
    captured: list[str] = field(default_factory=list)
    """The values the capture asks for, after the rounds."""
    element_types: dict[str, str] = field(default_factory=dict)
    capture_layers: list[ExecutedLayer] = field(default_factory=list)
    rounds: int = 0
    dropped: dict[str, str] = field(default_factory=dict)
    """Value -> the production layer whose fusion it changed, or is known to change (left
    out from the start, step 3): why it is not captured."""
    compiled: ov.CompiledModel | None = None
    """The capture's compiled model (production's own when nothing is captured)."""

    @property
    def layers_match_production(self) -> bool:
        """The capture executes production's layers, signature for signature.

        In any order: two independent branches (a model's two inputs) may run either way
        round, and each layer still computes the same from the same inputs.
        """
        return same_layers(self.capture_layers, self.production_layers)

    def describe(self) -> JsonObject:
        """The plan for the report's ``capture`` entry."""
        return {"mode": "executed layers", "executed_layers": len(self.production_layers),
                "candidates": len(self.candidates), "captured": len(self.captured),
                "dropped": len(self.dropped), "rounds": self.rounds,
                "layers_match_production": self.layers_match_production,
                "fusions_match_production": self.layers_match_production}


def same_layers(these: Sequence[ExecutedLayer], those: Sequence[ExecutedLayer]) -> bool:
    """The same executed layers, signature for signature, in whatever order."""
    return Counter(layer.signature() for layer in these) == Counter(
        layer.signature() for layer in those)


def leaving_values(layers: Sequence[ExecutedLayer], index: GraphView,
                   finals: set[str]) -> dict[str, ExecutedLayer]:
    """Each value that leaves its layer (read by a node outside it), with that layer.

    The graph's final outputs are outputs already and are not listed. A node held by
    two layers (a part split off it runs first) leaves from the last, which computes it.
    """
    home = {node: position for position, layer in enumerate(layers) for node in layer.nodes}
    leaving: dict[str, ExecutedLayer] = {}
    for position, layer in enumerate(layers):
        inside = set(layer.nodes)
        for node in layer.nodes:
            if home[node] != position:
                continue
            for value in index.outputs[node]:
                if value in finals or value in leaving:
                    continue
                if any(reader not in inside for reader in index.consumers.get(value, ())):
                    leaving[value] = layer
    return leaving


def plan_capture(production_layers: list[ExecutedLayer], index: GraphView,
                 finals: set[str],
                 compile_capture: Callable[[list[str], dict[str, str]],
                                           tuple[ov.CompiledModel, list[ExecutedLayer]]],
                 ) -> OpenVinoPlan:
    """Compile captures until one executes production's layers (module docstring).

    ``compile_capture(names, element_types)``: the compiled model with those values
    made outputs, and its executed layers.
    """
    leaving = leaving_values(production_layers, index, finals)
    plan = OpenVinoPlan(production_layers, candidates=list(leaving))
    trial = _Trial(plan, leaving, index, compile_capture)
    plan.dropped.update(_foreseen(production_layers, index, leaving))
    wanted = [name for name in leaving if name not in plan.dropped]
    lost = trial(wanted)
    plan.rounds = 1
    if not lost:
        return plan
    # First guess: what the changed layers hand out themselves (module docstring);
    # none where only layers were added, which says nothing of where.
    held = {node for layer in production_layers for node in layer.nodes}
    for layer in lost if len(lost) < len(production_layers) else ():
        # A residual added in place is what a Convolution is lost to, not what it hands
        # out (ResNet's blocks: their outputs are kept, their shortcuts are not; most
        # are foreseen, step 3).
        in_place = _added_in_place(layer, index) & leaving.keys()
        for value in in_place or _handed_out(layer, index, held):
            if value in leaving:
                plan.dropped.setdefault(value, layer.name)
    guessed = set(plan.dropped)
    regions: dict[str, list[str]] = {}
    radius: Counter = Counter()
    while True:
        wanted = [name for name in wanted if name not in plan.dropped]
        plan.rounds += 1
        lost = trial(wanted if plan.rounds < MAX_ROUNDS else [])
        if not lost or plan.rounds == MAX_ROUNDS:
            break
        logger.info("OpenVINO capture round %d: %d of production's layers changed",
                    plan.rounds, len(lost))
        for layer in lost:  # drop by neighbourhood, a node further each round
            for value in sorted(_touching(layer, index, radius[layer.signature()]) & set(wanted),
                                key=plan.candidates.index):
                if value in plan.dropped:  # dropped for a layer before this one
                    continue
                plan.dropped[value] = layer.name
                regions.setdefault(layer.name, []).append(value)
            radius[layer.signature()] += 1
    if lost:  # not even production's outputs alone: nothing kept
        return plan
    if regions:  # the first guess was not enough: every dropped value is tried back
        for value in guessed:
            regions.setdefault(plan.dropped[value], []).append(value)
        _restore(plan, regions, trial, index)
    return plan


class _Trial:
    """Compiles captures; keeps in the plan the last one whose layers are production's."""

    def __init__(self, plan: OpenVinoPlan, leaving: dict[str, ExecutedLayer],
                 index: GraphView, compile_capture: Callable[[list[str], dict[str, str]],
                                           tuple[ov.CompiledModel, list[ExecutedLayer]]],
                 ) -> None:
        self.plan, self.leaving, self.compile_capture = plan, leaving, compile_capture
        self.index = index

    def __call__(self, wanted: Sequence[str]) -> list[ExecutedLayer]:
        """Production's layers the capture asking for ``wanted`` does not execute."""
        plan, order = self.plan, {name: position for position, name
                                  in enumerate(self.plan.candidates)}
        wanted = sorted(wanted, key=order.__getitem__)
        types = {name: NARROW_TYPES[self.leaving[name].output_precision] for name in wanted
                 if self.leaving[name].output_precision in NARROW_TYPES}
        compiled, layers = self.compile_capture(wanted, types)
        layers = _without_output_converts(
            layers, {self.index.producer.get(name, name) for name in wanted})
        lost = Counter(layer.signature() for layer in plan.production_layers) - Counter(
            layer.signature() for layer in layers)
        changed = [layer for layer in plan.production_layers if layer.signature() in lost]
        if not changed and not same_layers(layers, plan.production_layers):
            changed = list(plan.production_layers)  # layers added: nothing to go by
        if not changed or not plan.capture_layers or not wanted:
            plan.compiled, plan.capture_layers = compiled, layers
            plan.captured, plan.element_types = wanted, types
        return _located(changed, layers, plan.production_layers)


def _without_output_converts(layers: list[ExecutedLayer],
                             producers: set[str]) -> list[ExecutedLayer]:
    """``layers`` less what only hands a value out in its declared type.

    A mask OpenVINO computes as ``u8`` (an ``IsNaN``'s boolean) or an index it computes
    as ``i32`` is converted to the ONNX type when made an output: a layer of its own,
    named after the node whose output it converts (``node_IsNaN_75.0``), which changes
    nothing production computes. Where the node was already a copy of OpenVINO's (an
    ``i64`` Unsqueeze of BERT's attention mask, run in ``i32``), the Convert is
    ``node_Unsqueeze_437.0.0`` and the layer computing the node is renamed
    ``node_Unsqueeze_437.0``, naming no ONNX node: it is the node's layer, as in
    production.
    """
    converts = {blank_numbers(f"{producer}{suffix}") for producer in producers
                for suffix in (".0", ".0.0")}
    kept = []
    for layer in layers:
        if not layer.nodes and layer.own_operations and set(layer.own_operations) <= converts:
            if layer.layer_type == "Convert":
                continue
            node = layer.name.removesuffix(".0")
            if len(layer.own_operations) == 1 and node != layer.name and node in producers:
                layer = replace(layer, name=node, nodes=(node,), own_operations=())
        kept.append(layer)
    return kept


def _located(changed: list[ExecutedLayer], layers: Sequence[ExecutedLayer],
             production: Sequence[ExecutedLayer]) -> list[ExecutedLayer]:
    """The changed layers, those without an ONNX node stood for by the capture's strays.

    A production layer of OpenVINO's own operations only (a Multiply it made) names no
    ONNX node, so nothing says where it is; the capture's layers computing nodes that no
    production layer names (the node it was made from, under its own name again) say
    where the change is.
    """
    if all(layer.nodes for layer in changed):
        return changed
    held = {node for layer in production for node in layer.nodes}
    strays = [layer for layer in layers if layer.nodes and not held.intersection(layer.nodes)]
    return [layer for layer in changed if layer.nodes] + strays


def _foreseen(production_layers: Sequence[ExecutedLayer], index: GraphView,
              leaving: dict[str, ExecutedLayer]) -> dict[str, str]:
    """Values that break their layer's fusion when asked for, known from production alone.

    Value -> the layer. Each kind was seen to break its layer in every model measured
    (BERT-base, ResNet-50, the tiny Hugging Face architectures): a FullyConnected that
    folded a scale into its weights moved it across the layout after it (the values its
    first guess drops); an attention Subgraph's Transposes split off; a Convolution adds
    its residual in place. Dropped before the first compilation, they save one (BERT-base
    and ResNet-50 reach production's layers in one), and are tried back with the other
    guesses where later rounds are needed.
    """
    held = {node for layer in production_layers for node in layer.nodes}
    dropped: dict[str, str] = {}
    for layer in production_layers:
        values = _added_in_place(layer, index)
        if layer.layer_type == "FullyConnected" and layer.own_operations:
            values |= _handed_out(layer, index, held)
        if layer.layer_type == "Subgraph":
            values |= {value for node in layer.nodes if index.op_types.get(node) == "Transpose"
                       for value in index.outputs[node]}
        for value in sorted(values & leaving.keys()):
            dropped.setdefault(value, layer.name)
    return dropped


def _handed_out(layer: ExecutedLayer, index: GraphView, held: set[str]) -> set[str]:
    """The values a layer's nodes hand out, and where it folded an op, the layout after.

    A layer holding an operation OpenVINO made itself (a scale folded into a
    FullyConnected's weights) may have pulled it back across the Reshapes and
    Transposes after it, and across the nodes it folded in (``held``: the nodes some
    layer names; a bias Add, the scale's Mul are in none): a value on that path is
    where the folded op would have to be computed again.
    """
    values = {value for node in layer.nodes for value in index.outputs[node]}
    frontier = list(values) if layer.own_operations else []
    while frontier:
        for reader in index.consumers.get(frontier.pop(), ()):
            if reader in layer.nodes:
                continue
            if index.op_types.get(reader) in LAYOUT_OPS or reader not in held:
                new = set(index.outputs[reader]) - values
                values |= new
                frontier.extend(new)
    return values


def _added_in_place(layer: ExecutedLayer, index: GraphView) -> set[str]:
    """The residual input a Convolution layer adds its result into, in place.

    OpenVINO's CPU plugin fuses an Add of a Convolution's result and a value from
    outside (a ResNet block's shortcut) into the Convolution, which writes the sum into
    that value's buffer: made an output, the buffer cannot be overwritten, and the Add
    runs as a layer of its own (on ResNet-50, 4 of the 16 blocks' layers are lost that
    way to a shortcut that no lost layer hands out itself). Only Convolutions: an
    attention ``Subgraph`` adding a mask is not lost to the mask (BERT-base).
    """
    if layer.layer_type != "Convolution":
        return set()
    made = {value for node in layer.nodes for value in index.outputs[node]}
    added: set[str] = set()
    for node in layer.nodes:
        operands = index.inputs[node]
        if index.op_types.get(node) in ("Add", "Sum") and made.intersection(operands):
            added |= {value for value in operands if value not in made
                      and value in index.producer}
    return added


def _touching(layer: ExecutedLayer, index: GraphView, radius: int) -> set[str]:
    """The values a layer reads or writes, and those ``radius`` nodes further out."""
    nodes = set(layer.nodes)
    values: set[str] = set()
    for _ in range(radius + 1):
        values = {value for node in nodes
                  for value in (*index.inputs[node], *index.outputs[node])}
        nodes |= {index.producer[value] for value in values if value in index.producer}
        nodes |= {reader for value in values for reader in index.consumers.get(value, ())}
    return values


def _restore(plan: OpenVinoPlan, regions: dict[str, list[str]], trial: _Trial,
             index: GraphView) -> None:
    """Try the dropped values back, one group of each changed layer's per compilation.

    What breaks a fusion breaks it near itself, so the groups of layers far apart are
    tried in one compilation, and a layer it changes is blamed on the groups near it
    (all of them where none is): a blamed group is halved, the others kept for now.
    The plan always holds the last capture that compiled to production's layers, and
    the values kept for now are in every later compilation until one does.
    """
    queues = {name: [values] for name, values in regions.items()}
    pending: list[str] = []
    spent = 0
    while any(queues.values()) and spent < MAX_RESTORES:
        tried = {name: queue.pop(0) for name, queue in queues.items() if queue}
        lost = trial([*plan.captured, *pending, *(value for group in tried.values()
                                                   for value in group)])
        spent += 1
        if not lost:
            pending = []
            for group in tried.values():
                for value in group:
                    plan.dropped.pop(value, None)
            continue
        blamed = _blamed(lost, tried, index)
        for name, group in tried.items():
            if name not in blamed:
                pending.extend(group)
            elif len(group) > 1:
                queues[name][:0] = [group[:len(group) // 2], group[len(group) // 2:]]
    if pending and not trial([*plan.captured, *pending]):
        for value in pending:
            plan.dropped.pop(value, None)
    logger.info("OpenVINO capture: %d value(s) kept after %d restoring compilation(s)",
                len(plan.captured), spent)


def _blamed(lost: Sequence[ExecutedLayer], tried: dict[str, list[str]],
            index: GraphView) -> set[str]:
    """The tried groups near a changed layer (every group, where none is near one)."""
    blamed: set[str] = set()
    for layer in lost:
        near = _touching(layer, index, 2)
        close = {name for name, group in tried.items() if near.intersection(group)}
        blamed |= close or set(tried)
    return blamed
