"""An ONNX model as the *reference* side: every value it computes, by name.

Two ways to run it:

* ONNX Runtime with every node output promoted
  (:class:`~bisect_onnx.runtime.onnx_side.OnnxRuntimeSide` with ``promote="all"``):
  fast, any op ONNX Runtime has, with the provider and optimization level asked for;
* ONNX's reference evaluator (``onnx.reference.ReferenceEvaluator``), which follows the
  ONNX specification op by op in numpy and keeps every intermediate result: slow, but
  independent of ONNX Runtime's kernels and fusions. It knows only the standard
  domains, so a contrib op (``com.microsoft``) is refused up front, by name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bisect_onnx.errors import ModelError, UsageError, one_line
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.runtime.onnx_side import OnnxRuntimeSide, node_provenance
from bisect_onnx.runtime.sides import Capture, CapturedValue

__all__ = ["ReferenceEvaluatorSide", "reference_side", "EVALUATOR_DOMAINS"]

logger = logging.getLogger(__name__)

#: The operator domains ``onnx.reference`` implements.
EVALUATOR_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})


def reference_side(path: Path, runtime: Any, *, evaluator: bool) -> Any:
    """The side that runs the reference model, every value captured.

    ``runtime``: the reference's :class:`~bisect_onnx.pipeline.options.RuntimeOptions`
    (ONNX Runtime or OpenVINO), unless it runs in the evaluator.
    """
    if evaluator:
        return ReferenceEvaluatorSide(path)
    return runtime.candidate_side(path, promote="all")


class ReferenceEvaluatorSide:
    """Runs an ONNX model with ``onnx.reference.ReferenceEvaluator``, every value kept."""

    def __init__(self, path: Path) -> None:
        # The graph as bisect-onnx reads any ONNX file (nodes, metadata, input specs);
        # no ONNX Runtime session is made for it.
        self.graph = OnnxRuntimeSide(path, promote="all")
        self.path = self.graph.path
        self.model = self.graph.model
        self.nodes = self.graph.nodes
        self.inputs = self.graph.inputs
        self.output_names = self.graph.output_names
        self.opset = self.graph.opset
        check_evaluator_ops(self.model)
        self._evaluator: Any = None  # made at the first run, kept for the next samples

    def describe(self) -> dict[str, Any]:
        """What this side is, for the report."""
        return {**self.graph.describe(), "kind": "onnx-reference-evaluator",
                "provider": None, "opt_level": None}

    def describe_capture(self) -> dict[str, Any]:
        """Every value is computed and kept; nothing is fused."""
        names = [name for node in self.model.graph.node if node.op_type != "Constant"
                 for name in node.output if name]
        return {"mode": "all values (onnx.reference)", "values": len(names)}

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Evaluate the model once and keep every node output."""
        emit(CAPTURE_STARTED, "onnx.reference")
        evaluator = self._load()
        wanted = [name for node in self.nodes if node.op_type != "Constant"
                  for name in node.outputs if name]
        wanted += [name for name in self.output_names if name not in wanted]
        feeds = {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}
        try:
            results = evaluator.run(wanted, feeds)
        except Exception as error:
            raise ModelError(f"ONNX's reference evaluator failed on {self.path.name}: "
                             f"{one_line(error)}") from error
        by_name = dict(zip(wanted, results, strict=True))
        values: dict[str, CapturedValue] = {}
        producers = {}
        for node in self.nodes:
            for output in node.outputs:
                if output in by_name and node.op_type != "Constant" and output not in values:
                    producers[output] = node
                    values[output] = CapturedValue(output, np.asarray(by_name[output]),
                                                   node_provenance(node, len(values)))
        outputs = [CapturedValue(name, np.asarray(by_name[name]),
                                 node_provenance(producers[name], index) if name in producers
                                 else Provenance(position=index))
                   for index, name in enumerate(self.output_names)]
        logger.info("onnx.reference produced %d values", len(values))
        return Capture(values=values, outputs=outputs)

    def _load(self) -> Any:
        """The evaluator of the model with its weights, loaded once for every sample."""
        if self._evaluator is None:
            import onnx
            from onnx.reference import ReferenceEvaluator

            try:
                model = onnx.load(str(self.path))  # with its external weights
                self._evaluator = ReferenceEvaluator(model)
            except Exception as error:
                raise ModelError(f"ONNX's reference evaluator could not load "
                                 f"{self.path.name}: {one_line(error)}; use ONNX Runtime as "
                                 "the reference (drop --against-reference-evaluator)") from error
        return self._evaluator


def check_evaluator_ops(model: Any) -> None:
    """Refuse, by name, the first op ``onnx.reference`` cannot run (a contrib op)."""
    local = {function.domain for function in model.functions}
    for node in model.graph.node:
        if node.domain not in EVALUATOR_DOMAINS and node.domain not in local:
            raise UsageError(
                f"ONNX's reference evaluator cannot run {node.domain}.{node.op_type} (node "
                f"{node.name or node.op_type!r}), an op outside the ONNX standard; use ONNX "
                "Runtime as the reference instead (drop --against-reference-evaluator)")
