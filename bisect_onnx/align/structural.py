"""Pair the values of a renamed ONNX graph with those of a graph whose names we know.

The *template* is a graph whose value names mean something (our own dynamo export:
they are torch FX node names). The *foreign* graph is the same model after a tool
that renamed every value and dropped the metadata (onnxsim, ONNX Runtime's offline
optimization, a converter). Nothing but structure is left to pair them by.

:func:`~bisect_onnx.align.graph_description.describe_model` reduces an ONNX model to a
:class:`~bisect_onnx.align.graph_description.GraphDescription`; :func:`match_graphs`
reads only descriptions and numpy arrays. Each match says which evidence decided it (``how``):

============  ==========================================================================
``input``     graph inputs, by position
``output``    graph outputs left unpaired by the rules below, by position
``topology``  same op type, output shapes and dtypes, and every input the counterpart
              of the template node's input at that position (either order for
              commutative ops); initializers count as counterparts when their contents
              are equal, which tells apart parallel branches (q, k, v) of one shape
``region``    some inputs come from nodes the template lacks (fused, folded): the
              unpaired stretch above the node must rest on the same paired values and
              shared initializers as the template candidate's unpaired stretch
``values``    several candidates fitted equally and the run-time values of exactly one
              agree, upstream of any divergence (the node's paired inputs all agree)
``position``  several fitted equally in a region: the first still-unpaired one in
              template order is taken, as rewriting tools keep the order of alike nodes
``consumer``  a value whose producer found no counterpart (a fused node's output) takes
              the template value at the same input of the node its consumer matched
``ambiguous`` several fitted equally and nothing above broke the tie; none is taken
``unmatched`` nothing fitted: a node the template lacks, or whose weights differ from
              every candidate's (a Conv with a BatchNorm folded into it)
============  ==========================================================================

Pairing is injective (a template value, once taken, is no candidate any more), visits
foreign nodes once in graph order, and looks at most :data:`MAX_REGION_NODES` nodes
upstream per candidate: no search over combinations, so large graphs stay fast.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bisect_onnx.align.graph_description import (
    GraphDescription,
    content_key,
    is_constant_node,
    output_at,
    producers,
    strip_omitted,
    walk_up,
)
from bisect_onnx.align.structural_match import Agree, How, StructuralMatch
from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["StructuralMatch", "How", "Agree", "match_graphs", "MAX_REGION_NODES"]

# Confidence ranks the evidence (see the module docstring); it is not a calibrated probability.
TOPOLOGY_CONFIDENCE = 1.0  # one candidate, every input accounted for
VALUES_CONFIDENCE = 0.9  # structure tied; the data picked one, upstream of any divergence
REGION_CONFIDENCE = 0.8  # times the share of the foreign region's anchors the template's has
POSITION_CONFIDENCE = 0.5  # times that share: structure tied and graph order picked
CONSUMER_DISCOUNT = 0.9  # one inference step weaker than the consumer's own match

#: Upstream nodes a region may span. Fusions replace a handful of nodes (Conv+BN+Relu,
#: MatMul+Add, a LayerNorm's ten primitives, an attention's ~20); a longer unpaired
#: stretch is not a local rewrite, and stopping there keeps the walk per node bounded.
MAX_REGION_NODES = 32

COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Sum", "Mean", "Max", "Min", "And", "Or", "Xor",
                             "Equal"})


def match_graphs(
    template: GraphDescription,
    foreign: GraphDescription,
    *,
    agree: Agree | None = None,
) -> list[StructuralMatch]:
    """Pair each foreign graph input and computed value with a template value.

    Args:
        template: The graph whose value names are known.
        foreign: The renamed graph; its nodes are visited in its own order.
        agree: Says whether a foreign and a template run-time value hold the same
            tensor; without it (or without ``values`` in both descriptions) run-time
            values never break ties.

    Returns:
        One match per foreign graph input and per node output that is not a constant,
        graph inputs first, then in node order.
    """
    return _Matcher(template, foreign, agree).run()


@dataclass(frozen=True)
class _Fit:
    """A template node that can stand for the foreign node being visited."""

    index: int
    inputs: tuple[str, ...]
    """The template input facing each foreign input (reordered for commutative ops)."""
    complete: bool
    """Whether every foreign input is the counterpart of the template input it faces."""


# A region anchor: ("value", template name) for a paired value, ("constant", content key).
_Anchor = tuple[str, str]


@dataclass(frozen=True)
class _Region:
    """The paired values and shared initializers an unpaired stretch of graph rests on."""

    anchors: frozenset[_Anchor]
    rests_on: frozenset[str]
    """The paired foreign values among the anchors."""
    passes_ambiguity: bool
    """Whether the stretch contains an ambiguous value: graph order then proves nothing."""


class _Matcher:
    """The pairing state of one :func:`match_graphs` call."""

    def __init__(self, template: GraphDescription, foreign: GraphDescription,
                 agree: Agree | None) -> None:
        self.template, self.foreign, self.agree = template, foreign, agree
        self.template_keys = {name: content_key(a) for name, a in template.constants.items()}
        self.foreign_keys = {name: content_key(a) for name, a in foreign.constants.items()}
        self.shared_keys = set(self.template_keys.values()) & set(self.foreign_keys.values())
        self.template_producer = producers(template.nodes)
        self.foreign_producer = producers(foreign.nodes)
        self.consumers: dict[str, list[int]] = defaultdict(list)
        self.by_op: dict[tuple[str, str], list[int]] = defaultdict(list)
        for index, node in enumerate(template.nodes):
            if not is_constant_node(node, template.constants):
                self.by_op[(node.domain, node.op_type)].append(index)
                for name in dict.fromkeys(node.inputs):
                    self.consumers[name].append(index)
        self.paired: dict[str, str] = {}  # foreign value -> template value
        self.taken: set[str] = set()
        self.done: set[int] = set()  # template nodes standing for a foreign node
        self.ambiguous: set[str] = set()
        self.results: dict[str, StructuralMatch] = {}

    def run(self) -> list[StructuralMatch]:
        """Pair graph inputs by position, then visit the foreign nodes in order."""
        for position, name in enumerate(self.foreign.inputs):
            counterpart = (self.template.inputs[position]
                           if position < len(self.template.inputs) else None)
            if counterpart and self.foreign.spec(name).fits(self.template.spec(counterpart)):
                self._pair(name, counterpart, "input", TOPOLOGY_CONFIDENCE)
            else:
                self.results[name] = StructuralMatch(name, None, 0.0, "unmatched")
        for node in self.foreign.nodes:
            if not is_constant_node(node, self.foreign.constants):
                self._visit(node)
        # The model's outputs are the same tensors by contract, however they were computed
        # (the last Linear rewritten as Reshape-Gemm-Reshape leaves no consumer to infer from).
        for name, counterpart in zip(self.foreign.outputs, self.template.outputs, strict=False):
            self._infer(name, counterpart, "output", TOPOLOGY_CONFIDENCE)
        return list(self.results.values())

    def _visit(self, node: NodeInfo) -> None:
        fits = [fit for index in self._candidates(node)
                if (fit := self._fit(node, index)) is not None]
        complete = [fit for fit in fits if fit.complete]
        if complete:
            self._choose(node, complete, how="topology", confidence=TOPOLOGY_CONFIDENCE,
                         rests_on=[name for name in node.inputs if name in self.paired])
        elif fits:
            self._choose_by_region(node, fits)
        else:
            self._leave(node, "unmatched")

    def _choose(self, node: NodeInfo, fits: Sequence[_Fit], *, how: How, confidence: float,
                rests_on: Iterable[str], by_order: float | None = None,
                ) -> tuple[_Fit, float] | None:
        """Take the one fit, or break a tie by values, then by order when ``by_order`` is set.

        ``rests_on`` names the paired foreign values the node is computed from: values
        break a tie only where those all agree with their counterparts.

        Returns the fit taken and the match's confidence, ``None`` when left ambiguous.
        """
        if len(fits) == 1:
            chosen = fits[0]
        elif (chosen := self._by_values(node, fits, rests_on)) is not None:
            how, confidence = "values", VALUES_CONFIDENCE
        elif by_order is not None:
            chosen = min(fits, key=lambda fit: fit.index)
            how, confidence = "position", by_order
        else:
            self._leave(node, "ambiguous", fits)
            return None
        self._pair_node(node, chosen, how, confidence)
        return chosen, confidence

    def _choose_by_region(self, node: NodeInfo, fits: Sequence[_Fit]) -> None:
        """Pick among partial fits by the stretch of graph each rests on (fusions, folds)."""
        region = self._foreign_region(node)
        scored = [] if region is None else [
            (len(anchors), fit) for fit in fits
            if (anchors := self._template_region(fit, region.anchors)) is not None]
        if region is None or not scored:
            self._leave(node, "unmatched")
            return
        best = max(size for size, _ in scored)
        share = best / len(region.anchors) if region.anchors else 1.0
        taken = self._choose(
            node, [fit for size, fit in scored if size == best],
            how="region", confidence=REGION_CONFIDENCE * share, rests_on=region.rests_on,
            by_order=None if region.passes_ambiguity else POSITION_CONFIDENCE * share)
        if taken is None:
            return
        chosen, confidence = taken
        # What a node reads at an input is what its counterpart reads there, whatever
        # produced it: a fused node's output is the value that ends the unfused chain.
        for name, counterpart in zip(node.inputs, chosen.inputs, strict=False):
            self._infer(name, counterpart, "consumer", confidence * CONSUMER_DISCOUNT)

    def _infer(self, name: str, counterpart: str, how: How, confidence: float) -> None:
        """Pair a value its producer left unmatched, if the counterpart is free and alike."""
        earlier = self.results.get(name)
        if (earlier is not None and earlier.how == "unmatched"
                and counterpart and counterpart not in self.taken
                and counterpart not in self.template.constants
                and self.foreign.spec(name).fits(self.template.spec(counterpart))):
            self._pair(name, counterpart, how, confidence)

    def _candidates(self, node: NodeInfo) -> list[int]:
        """Unpaired template nodes of the op type, narrowed by a paired input's readers."""
        pools = [self.consumers.get(self.paired[name], ()) for name in node.inputs
                 if name in self.paired]
        pool = min(pools, key=len) if pools else self.by_op.get((node.domain, node.op_type), ())
        return [index for index in pool if index not in self.done
                and self.template.nodes[index].op_type == node.op_type
                and self.template.nodes[index].domain == node.domain]

    def _fit(self, node: NodeInfo, index: int) -> _Fit | None:
        """Whether template node ``index`` can stand for ``node``, and how fully."""
        candidate = self.template.nodes[index]
        foreign_outputs = strip_omitted(node.outputs)
        template_outputs = strip_omitted(candidate.outputs)
        if len(foreign_outputs) > len(template_outputs):
            return None
        for name, counterpart in zip(foreign_outputs, template_outputs, strict=False):
            if name and (not counterpart or counterpart in self.taken
                         or not self.foreign.spec(name).fits(self.template.spec(counterpart))):
                return None
        inputs, template_inputs = strip_omitted(node.inputs), strip_omitted(candidate.inputs)
        if len(inputs) != len(template_inputs):
            return None
        if node.op_type in COMMUTATIVE_OPS and node.domain in ("", "ai.onnx"):
            return self._fit_any_order(index, inputs, template_inputs)
        faced = [self._faces(name, counterpart) for name, counterpart in
                 zip(inputs, template_inputs, strict=True)]
        if None in faced:
            return None
        return _Fit(index, template_inputs, all(faced))

    def _fit_any_order(self, index: int, inputs: Sequence[str],
                       template_inputs: Sequence[str]) -> _Fit | None:
        """Face inputs in any order: exact counterparts first, then the rest in order."""
        facing: list[str | None] = [None] * len(inputs)
        free = list(range(len(template_inputs)))
        for want_exact in (True, False):
            for position, name in enumerate(inputs):
                if facing[position] is not None:
                    continue
                for slot in free:
                    if self._faces(name, template_inputs[slot]) is want_exact:
                        facing[position] = template_inputs[slot]
                        free.remove(slot)
                        break
        if free:
            return None
        faced = tuple(name for name in facing if name is not None)
        complete = all(self._faces(a, b) for a, b in zip(inputs, faced, strict=True))
        return _Fit(index, faced, complete)

    def _faces(self, name: str, counterpart: str) -> bool | None:
        """``True``: counterparts; ``False``: may be (unknown yet); ``None``: cannot be."""
        if not name or not counterpart:
            return True if name == counterpart else None
        foreign_const = name in self.foreign_keys
        template_const = counterpart in self.template_keys
        if foreign_const and template_const:
            # Different weights are a different computation (a BatchNorm folded in).
            return True if self.foreign_keys[name] == self.template_keys[counterpart] else None
        if name in self.paired:
            return True if self.paired[name] == counterpart else None
        if counterpart in self.taken:
            return None
        return False  # unpaired, or a constant on one side only (a folded shape computation)

    def _foreign_region(self, node: NodeInfo) -> _Region | None:
        """Anchors above ``node`` through unpaired foreign values; ``None`` when too long."""
        anchors: set[_Anchor] = set()
        rests_on: set[str] = set()
        passes_ambiguity = False
        for name in walk_up(node.inputs, self.foreign.nodes, self.foreign_producer,
                            through=lambda name: name not in self.foreign_keys
                            and name not in self.paired, limit=MAX_REGION_NODES):
            if name is None:
                return None
            passes_ambiguity |= name in self.ambiguous
            if name in self.paired:
                anchors.add(("value", self.paired[name]))
                rests_on.add(name)
            elif self.foreign_keys.get(name) in self.shared_keys:
                anchors.add(("constant", self.foreign_keys[name]))
        return _Region(frozenset(anchors), frozenset(rests_on), passes_ambiguity)

    def _template_region(self, fit: _Fit, anchors: frozenset[_Anchor]) -> set[_Anchor] | None:
        """The candidate's anchors, or ``None`` as soon as it rests on one the foreign lacks."""
        found: set[_Anchor] = set()
        for name in walk_up(fit.inputs, self.template.nodes, self.template_producer,
                            through=lambda name: name not in self.template_keys
                            and name not in self.taken
                            and self.template_producer.get(name) not in self.done,
                            limit=MAX_REGION_NODES):
            if name is None:
                return None
            if name in self.taken:
                anchor: _Anchor = ("value", name)
            elif self.template_keys.get(name) in self.shared_keys:
                anchor = ("constant", self.template_keys[name])
            else:
                continue  # computed on the way, or an initializer the foreign graph lacks
            if anchor not in anchors:
                return None
            found.add(anchor)
        # Resting on fewer paired values would compute from less: not the same tensor.
        if {a for a in anchors if a[0] == "value"} - found:
            return None
        return found

    def _by_values(self, node: NodeInfo, fits: Sequence[_Fit],
                   rests_on: Iterable[str]) -> _Fit | None:
        """The one fit whose values agree, if what the node rests on all agrees first."""
        if self.agree is None:
            return None
        for name in rests_on:
            if not self._agrees(name, self.paired[name]):
                return None  # at or past the divergence: disagreement says nothing here
        outputs = [(i, name) for i, name in enumerate(node.outputs)
                   if name and name not in self.foreign.constants]
        agreeing = [fit for fit in fits if all(
            self._agrees(name, self.template.nodes[fit.index].outputs[i]) for i, name in outputs)]
        return agreeing[0] if len(agreeing) == 1 else None

    def _agrees(self, name: str, counterpart: str) -> bool:
        foreign_value = self.foreign.values.get(name)
        template_value = self.template.values.get(counterpart)
        if foreign_value is None or template_value is None or self.agree is None:
            return False
        return bool(self.agree(foreign_value, template_value))

    def _pair_node(self, node: NodeInfo, fit: _Fit, how: How, confidence: float) -> None:
        self.done.add(fit.index)
        template_outputs = self.template.nodes[fit.index].outputs
        for name, counterpart in zip(node.outputs, template_outputs, strict=False):
            if name and name not in self.foreign.constants:
                self._pair(name, counterpart, how, confidence)

    def _pair(self, name: str, counterpart: str, how: How, confidence: float) -> None:
        self.paired[name] = counterpart
        self.taken.add(counterpart)
        self.ambiguous.discard(name)
        self.results[name] = StructuralMatch(name, counterpart, confidence, how)

    def _leave(self, node: NodeInfo, how: How, fits: Sequence[_Fit] = ()) -> None:
        for position, name in enumerate(node.outputs):
            if not name or name in self.foreign.constants:
                continue
            alternatives = tuple(output_at(self.template.nodes[fit.index], position)
                                 for fit in fits)
            if how == "ambiguous":
                self.ambiguous.add(name)
            self.results[name] = StructuralMatch(name, None, 0.0, how, alternatives)

