"""Which values to make outputs so that OpenVINO still executes production's layers.

Making a value an output changes what OpenVINO compiles: a Convolution whose residual
input is an output can no longer add into that buffer in place (Conv+Add+Relu becomes
a Convolution and an Eltwise), a scale folded into a FullyConnected moves out of it,
and a value handed out as float32 makes its bf16 layer write float32. So:

1. production is compiled, and its executed layers read
   (:mod:`bisect_onnx.runtime.openvino_layers`);
2. the candidates are the values leaving each layer (the outputs of its ONNX nodes
   that a node outside the layer reads), each asked for in its layer's output
   precision (bf16 stays bf16);
3. the capture is compiled and its layers compared with production's, signature by
   signature (type, runtime precision, output precisions, the ONNX nodes and
   OpenVINO's own operations fused in);
4. for every production layer the capture lost, the captured values touching it are
   dropped (its inputs and outputs first, then a node further each time it still
   changes), and the capture compiled again, until the layers are production's.

Dropping by neighbourhood drops more than it must (a Convolution's input is dropped
with the residual input that broke its in-place sum), so the dropped values are then
tried back in groups (halved where a group changes the layers, within
:data:`MAX_RESTORES` compilations), each group kept only where the layers stay
production's. What stays dropped is inside production's fusions as far as the
capture can tell: such a value is pinned by running its nodes locally on reference
values (as for ONNX Runtime's fused kernels). A plan that cannot reach production's layers within
:data:`MAX_ROUNDS` keeps nothing: the capture is then production itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bisect_onnx.runtime.openvino_layers import ExecutedLayer, GraphIndex
from bisect_onnx.runtime.openvino_sessions import NARROW_TYPES

__all__ = ["OpenVinoPlan", "plan_capture", "leaving_values", "MAX_ROUNDS"]

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
    """Value -> the production layer whose fusion it changed (why it is not captured)."""
    compiled: Any = None
    """The capture's compiled model (production's own when nothing is captured)."""

    @property
    def layers_match_production(self) -> bool:
        """The capture executes production's layers, signature for signature, in order."""
        return ([layer.signature() for layer in self.capture_layers]
                == [layer.signature() for layer in self.production_layers])

    def describe(self) -> dict[str, Any]:
        """The plan for the report's ``capture`` entry."""
        return {"mode": "executed layers", "executed_layers": len(self.production_layers),
                "candidates": len(self.candidates), "captured": len(self.captured),
                "dropped": len(self.dropped), "rounds": self.rounds,
                "layers_match_production": self.layers_match_production,
                "fusions_match_production": self.layers_match_production}

    def layer_of(self, node: str) -> ExecutedLayer | None:
        """Production's executed layer that computes ONNX node ``node``."""
        return next((layer for layer in self.production_layers if node in layer.nodes), None)


def leaving_values(layers: Sequence[ExecutedLayer], index: GraphIndex,
                   finals: set[str]) -> dict[str, ExecutedLayer]:
    """Each value that leaves its layer (read by a node outside it), with that layer.

    The graph's final outputs are outputs already and are not listed.
    """
    leaving: dict[str, ExecutedLayer] = {}
    for layer in layers:
        inside = set(layer.nodes)
        for node in layer.nodes:
            for value in index.outputs[node]:
                if value in finals or value in leaving:
                    continue
                if any(reader not in inside for reader in index.consumers.get(value, ())):
                    leaving[value] = layer
    return leaving


def plan_capture(production_layers: list[ExecutedLayer], index: GraphIndex,
                 finals: set[str],
                 compile_capture: Callable[[list[str], dict[str, str]],
                                           tuple[Any, list[ExecutedLayer]]],
                 ) -> OpenVinoPlan:
    """Compile captures until one executes production's layers (module docstring).

    ``compile_capture(names, element_types)``: the compiled model with those values
    made outputs, and its executed layers.
    """
    leaving = leaving_values(production_layers, index, finals)
    plan = OpenVinoPlan(production_layers, candidates=list(leaving))
    wanted = list(leaving)
    radius: Counter = Counter()
    for plan.rounds in range(1, MAX_ROUNDS + 1):
        types = {name: NARROW_TYPES[leaving[name].output_precision] for name in wanted
                 if leaving[name].output_precision in NARROW_TYPES}
        plan.compiled, plan.capture_layers = compile_capture(wanted, types)
        plan.captured, plan.element_types = list(wanted), types
        lost = Counter(layer.signature() for layer in production_layers) - Counter(
            layer.signature() for layer in plan.capture_layers)
        if not lost and plan.layers_match_production:
            if plan.dropped:
                _restore(plan, leaving, compile_capture)
            return plan
        changed = [layer for layer in production_layers if layer.signature() in lost] or (
            production_layers)  # the same layers in another order: nothing to go by
        touching: dict[str, str] = {}
        for layer in changed:
            for value in _touching(layer, index, radius[layer.signature()]):
                touching.setdefault(value, layer.name)
            radius[layer.signature()] += 1
        logger.info("OpenVINO capture round %d: %d of production's layers changed",
                    plan.rounds, len(changed))
        kept = [name for name in wanted if name not in touching]
        plan.dropped.update({name: touching[name] for name in wanted if name in touching})
        wanted = kept if plan.rounds < MAX_ROUNDS - 1 else []
    return plan


def _touching(layer: ExecutedLayer, index: GraphIndex, radius: int) -> set[str]:
    """The values a layer reads or writes, and those ``radius`` nodes further out."""
    nodes = set(layer.nodes)
    values: set[str] = set()
    for _ in range(radius + 1):
        values = {value for node in nodes
                  for value in (*index.inputs[node], *index.outputs[node])}
        nodes |= {index.producer[value] for value in values if value in index.producer}
        nodes |= {reader for value in values for reader in index.consumers.get(value, ())}
    return values


def _restore(plan: OpenVinoPlan, leaving: dict[str, ExecutedLayer],
             compile_capture: Callable[[list[str], dict[str, str]],
                                       tuple[Any, list[ExecutedLayer]]]) -> None:
    """Try the dropped values back in groups; keep each group the layers allow.

    The plan always holds the last capture that compiled to production's layers.
    """
    order = {name: position for position, name in enumerate(plan.candidates)}
    groups = [sorted(plan.dropped, key=order.__getitem__)]
    spent = 0
    while groups and spent < MAX_RESTORES:
        group = groups.pop(0)
        wanted = sorted([*plan.captured, *group], key=order.__getitem__)
        types = {name: NARROW_TYPES[leaving[name].output_precision] for name in wanted
                 if leaving[name].output_precision in NARROW_TYPES}
        compiled, layers = compile_capture(wanted, types)
        spent += 1
        if [layer.signature() for layer in layers] == [
                layer.signature() for layer in plan.production_layers]:
            plan.compiled, plan.capture_layers = compiled, layers
            plan.captured, plan.element_types = wanted, types
            for name in group:
                del plan.dropped[name]
        elif len(group) > 1:
            half = len(group) // 2
            groups[:0] = [group[:half], group[half:]]
    logger.info("OpenVINO capture: %d value(s) restored in %d compilation(s)",
                len(plan.captured), spent)
