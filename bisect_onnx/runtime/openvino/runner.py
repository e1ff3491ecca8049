"""An ONNX model run by OpenVINO's CPU plugin, captured under its compiled graph.

The candidate's values are the outputs of the layers OpenVINO executed, asked for so
that the capture compiles to production's layers (:mod:`bisect_onnx.runtime.openvino.plan`);
every run also runs production's own compiled model, and compares the capture's
final outputs with it, bitwise. Each captured value's provenance names the executed
layer that produced it (name, type, runtime precision).

The model is read from the user's path by OpenVINO itself: nothing is written. Local
checks and probes compile in OpenVINO too, in the same inference precision
(:meth:`OpenVinoRunner.local_session`, :meth:`OpenVinoRunner.probe_session`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo, node_provenance
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.runtime.openvino.layers import ExecutedLayer, executed_layers
from bisect_onnx.runtime.openvino.plan import OpenVinoPlan, plan_capture
from bisect_onnx.runtime.openvino.sessions import (
    OpenVinoSession,
    compile_model,
    default_precision,
    import_openvino,
    read_model,
    with_outputs,
)
from bisect_onnx.runtime.runner import (
    CompiledGraph,
    ProductionCheck,
    Runner,
    RuntimeRun,
    captured_by_node,
)
from bisect_onnx.runtime.sides import Capture, CapturedValue, JsonObject

if TYPE_CHECKING:
    import openvino as ov

__all__ = ["OpenVinoRunner"]

logger = logging.getLogger(__name__)


class OpenVinoRunner(Runner):
    """Runs an ONNX model in OpenVINO (CPU) with its executed layers' outputs captured.

    ``promote="fused"`` (the default) captures what production's layers let out;
    ``"all"``: every node output, which changes what OpenVINO fuses (a reference).
    """

    runtime = "openvino"

    def __init__(self, path: Path, *, precision: str | None = None,
                 promote: str = "fused") -> None:
        openvino = import_openvino()
        # Parsed (and its external weights' locations checked) before OpenVINO reads it.
        super().__init__(path, promote=promote)
        self.version = openvino.__version__
        self._core = openvino.Core()
        self.precision = precision or default_precision(self._core)
        """The inference precision asked for, or the CPU's default (``bf16``, ``f32``)."""
        self.asked_precision = precision
        self.plan: OpenVinoPlan | None = None
        self._read_model: ov.Model | None = None
        self._production: OpenVinoSession | None = None
        self._capture: OpenVinoSession | None = None
        self.production_layers: list[ExecutedLayer] | None = None
        self._last_production: tuple[dict[str, np.ndarray], list] | None = None

    #: Its compilations run on every core: nothing is imported beside them unless
    #: production's outputs diverge (a BERT-base run at parity paid 1.3 s of CPU for an
    #: import only a divergence uses; a diverged one saves 0.6 s to 0.9 s with it).
    prepares_on_one_core = False

    @property
    def provider(self) -> str:
        """The device, as the report names it beside ONNX Runtime's providers."""
        return "OpenVINO CPU"

    @property
    def label(self) -> str:
        """How the model is named in OpenVINO's error messages."""
        return self.path.name

    def describe(self) -> JsonObject:
        """What this side is, for the report."""
        return {"kind": self.runtime, "model": str(self.path),
                "producer": f"{self.model.producer_name} {self.model.producer_version}".strip(),
                "graph": self.model.graph.name, "nodes": len(self.nodes), "device": "CPU",
                "inference_precision": self.precision,
                "precision_asked": self.asked_precision, "openvino": self.version}

    def describe_capture(self, production: ProductionCheck | None) -> JsonObject:
        """How the capture was made and checked, for the report."""
        if self.promote == "all":
            return {"mode": "all values"} if self._capture is not None else {}
        if self.plan is None:
            return {}
        return {**self.plan.describe(), **(production or ProductionCheck()).describe()}

    def with_promotion(self, promote: str) -> OpenVinoRunner:
        """The same file in the same precision, capturing as ``promote`` says."""
        return OpenVinoRunner(self.path, precision=self.asked_precision, promote=promote)

    @property
    def layer_boundaries(self) -> frozenset[str]:
        """Values leaving one of production's executed layers, captured or not."""
        if self.promote == "all" or self.plan is None:
            return frozenset()
        return frozenset(self.plan.candidates)

    def layer_of(self, node: str) -> ExecutedLayer | None:
        """Production's executed layer that computes ONNX node ``node``.

        The last that holds it: a part split off a node (a weight's transpose) runs
        before the layer that computes the node's output.
        """
        self.prepare()
        return next((layer for layer in reversed(self.production_layers or ())
                     if node in layer.nodes), None)

    def where_it_ran(self, value: str, node: str | None) -> JsonObject:
        """Production's executed layer that computed ``node``, in its precision."""
        layer = self.layer_of(node)
        return {"runtime": self.runtime, "inference_precision": self.precision,
                "layer": layer.to_dict() if layer is not None else None}

    def prepare(self) -> OpenVinoPlan | None:
        """Production compiled and its layers read; the capture planned (made once)."""
        self._prepare_production()
        if self.plan is None and self.promote == "fused":
            self.plan = plan_capture(self.production_layers, self.view,
                                     set(self.output_names), self._compile_capture)
            self._capture = OpenVinoSession(self.plan.compiled, self.label)
            self._read_model = None  # its weights' copy: read again only if probes need it
            logger.info("OpenVINO capture: %d of %d values leaving executed layers kept "
                        "(%d rounds; layers match production: %s)", len(self.plan.captured),
                        len(self.plan.candidates), self.plan.rounds,
                        self.plan.layers_match_production)
        return self.plan

    def _prepare_production(self) -> OpenVinoSession:
        """Production compiled and its executed layers read (made once)."""
        if self._production is None:
            compiled = self._compile(self._read())
            self._production = OpenVinoSession(compiled, self.label)
            self.production_layers = executed_layers(compiled, self.view)
        return self._production

    def run(self, inputs: Sequence[np.ndarray]) -> RuntimeRun:
        """One run of the capture, one of production; their final outputs compared."""
        self.prepare()
        feeds = self._feeds(inputs)
        if self.promote == "all":
            if self._capture is None:
                names = [name for node in self.nodes if node.op_type != "Constant"
                         for name in node.outputs if name]
                model = with_outputs(self._read(), names)
                self._capture = OpenVinoSession(self._compile(model), self.label)
            return RuntimeRun(self._captured(self._capture.run_all(feeds)))
        by_name = self._capture.run_all(feeds)
        expected = self._production_run(feeds)
        difference = None
        matches = True
        for name, array in zip(self.output_names, expected, strict=True):
            got = by_name[name]
            if not np.array_equal(got, array, equal_nan=True):
                matches = False
                if got.shape == array.shape and got.dtype.kind == "f" and got.size:
                    difference = float(np.nanmax(np.abs(got.astype(np.float64) - array)))
        return RuntimeRun(self._captured(by_name), ProductionCheck(
            tuple(expected), matches, difference,
            "executed layers compared with production's; final outputs compared bitwise"))

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """Production's compiled model, one run: the final outputs only (nothing planned)."""
        self._prepare_production()
        arrays = self._production_run(self._feeds(inputs))
        return [CapturedValue(name, array, Provenance(position=index))
                for index, (name, array) in enumerate(zip(self.output_names, arrays,
                                                          strict=True))]

    def local_session(self, serialized: bytes, label: str) -> OpenVinoSession:
        """A local check's model (its nodes' copies), compiled in this side's precision."""
        return OpenVinoSession(self._compile(read_model(self._core, serialized, label)), label)

    def probe_session(self, names: Sequence[str] | None
                      ) -> tuple[OpenVinoSession, CompiledGraph]:
        """Production with ``names`` made outputs (``None``: none), and what it executed.

        Each value is asked for in its layer's precision; what it executed comes in the
        shape a probe's graph check reads (op counts, values, layer by layer).
        """
        self.prepare()
        leaving = {value: layer for layer in self.production_layers
                   for node in layer.nodes for value in self.view.outputs[node]}
        types = {name: layer.output_precision for name, layer in leaving.items()
                 if names and name in names and layer.output_precision in ("bf16", "f16")}
        compiled, layers = self._compile_capture(list(names or ()), types)
        return OpenVinoSession(compiled, self.label), CompiledGraph(
            Counter(layer.layer_type for layer in layers),
            {value for layer in layers for node in layer.nodes
             for value in self.view.outputs[node]},
            [layer.signature() for layer in layers])

    def _production_run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Production's final outputs on ``feeds``; the last ones again for the same feeds.

        The pipeline may ask for them before the capture is planned (to know early that
        they diverge), and :meth:`run` asks again.
        """
        last = self._last_production
        if last is None or last[0].keys() != feeds.keys() or not all(
                np.array_equal(last[0][name], array, equal_nan=True)
                for name, array in feeds.items()):
            # Copies: the caller's arrays may change in place before the next call.
            last = self._last_production = (
                {name: np.array(array) for name, array in feeds.items()},
                self._production.run(self.output_names, feeds))
        return last[1]

    def _compile_capture(self, names: list[str], types: dict[str, str]
                         ) -> tuple[ov.CompiledModel, list[ExecutedLayer]]:
        compiled = self._compile(with_outputs(self._read(), names, types))
        return compiled, executed_layers(compiled, self.view)

    def _read(self) -> ov.Model:
        """A fresh copy of the user's model as OpenVINO read it (read from disk once)."""
        if self._read_model is None:
            self._read_model = read_model(self._core, self.path, self.label)
        return self._read_model.clone()

    def _compile(self, model: ov.Model) -> ov.CompiledModel:
        return compile_model(self._core, model, self.asked_precision, self.label)

    def _feeds(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        return {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}

    def _captured(self, by_name: dict[str, np.ndarray]) -> Capture:
        """The values by ONNX node, each with the executed layer that produced it."""
        layers = {node: layer for layer in self.production_layers or ()
                  for node in layer.nodes}
        return captured_by_node(
            self.nodes, self.output_names, by_name,
            provenance=lambda node, position: self._provenance(node, position, layers))

    def _provenance(self, node: NodeInfo, position: int,
                    layers: dict[str, ExecutedLayer]) -> Provenance:
        provenance = node_provenance(node, position)
        layer = layers.get(node.name)
        if layer is None or self.promote == "all":  # all values: not production's layers
            return provenance
        return replace(provenance, runtime_layer=(layer.name, layer.layer_type,
                                                  layer.runtime_precision))
