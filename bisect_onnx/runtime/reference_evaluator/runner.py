"""An ONNX model as the *reference* side: every value it computes, by name.

Two ways to run it:

* its runtime's runner with every node output promoted (``promote="all"``):
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
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import ModelError, UsageError, one_line
from bisect_onnx.runtime.runner import (
    ProductionCheck,
    ReferenceOnlyRunner,
    RuntimeRun,
    captured_by_node,
)
from bisect_onnx.runtime.sides import CapturedValue, JsonObject

if TYPE_CHECKING:
    import numpy.typing as npt
    import onnx
    from onnx.reference import ReferenceEvaluator

__all__ = ["ReferenceEvaluatorRunner", "EVALUATOR_DOMAINS", "EVALUATOR"]

logger = logging.getLogger(__name__)

#: The runner's name: the report's ``reference.kind``.
EVALUATOR = "onnx-reference-evaluator"
#: Why the evaluator has no sessions of its own: it is never the runtime under test.
_REFERENCE_ONLY = ("ONNX's reference evaluator runs only as the reference; compare it "
                   "against a runtime (--against-reference-evaluator)")
#: The operator domains ``onnx.reference`` implements.
EVALUATOR_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})


class ReferenceEvaluatorRunner(ReferenceOnlyRunner):
    """Runs an ONNX model with ``onnx.reference.ReferenceEvaluator``, every value kept.

    It is a reference only: it compiles nothing, so there is no production to check
    against, probe or look up kernels in.
    """

    runtime = EVALUATOR
    reference_only = _REFERENCE_ONLY
    reference_label = "onnx.reference"

    def __init__(self, path: Path) -> None:
        # The graph as bisect-onnx reads any ONNX file (nodes, metadata, input specs).
        super().__init__(path, promote="all")
        check_evaluator_ops(self.model)
        # Made at the first run, kept for the next samples.
        self._evaluator: ReferenceEvaluator | None = None

    def describe(self) -> JsonObject:
        """What this runner is, for the report."""
        return {"kind": EVALUATOR, "model": str(self.path),
                "producer": f"{self.model.producer_name} {self.model.producer_version}".strip(),
                "graph": self.model.graph.name, "nodes": len(self.nodes),
                "provider": None, "opt_level": None}

    def describe_capture(self, production: ProductionCheck | None) -> JsonObject:
        """Every value is computed and kept; nothing is fused."""
        names = [name for node in self.model.graph.node if node.op_type != "Constant"
                 for name in node.output if name]
        return {"mode": "all values (onnx.reference)", "values": len(names)}

    def with_promotion(self, promote: str) -> ReferenceEvaluatorRunner:
        """Itself: the evaluator keeps every value whatever is asked."""
        return self

    def run(self, inputs: Sequence[np.ndarray]) -> RuntimeRun:
        """Evaluate the model once and keep every node output."""
        wanted = [name for node in self.nodes if node.op_type != "Constant"
                  for name in node.outputs if name]
        wanted += [name for name in self.output_names if name not in wanted]
        by_name = dict(zip(wanted, self._evaluate(wanted, inputs), strict=True))
        capture = captured_by_node(self.nodes, self.output_names, by_name,
                                   skip_constants=True)
        logger.info("onnx.reference produced %d values", len(capture.values))
        return RuntimeRun(capture)

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """The final outputs alone."""
        return self.run(inputs).capture.outputs



    def where_it_ran(self, value: str, node: str | None) -> JsonObject:
        """In numpy, op by op, as the ONNX specification says."""
        return {"runtime": self.runtime, "provider": None, "kernel": None}

    def _evaluate(self, wanted: list[str], inputs: Sequence[np.ndarray],
                  ) -> list[npt.ArrayLike]:
        evaluator = self._load()
        feeds = {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}
        try:
            return evaluator.run(wanted, feeds)
        except Exception as error:
            raise ModelError(f"ONNX's reference evaluator failed on {self.path.name}: "
                             f"{one_line(error)}") from error

    def _load(self) -> ReferenceEvaluator:
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


def check_evaluator_ops(model: onnx.ModelProto) -> None:
    """Refuse, by name, the first op ``onnx.reference`` cannot run (a contrib op)."""
    local = {function.domain for function in model.functions}
    for node in model.graph.node:
        if node.domain not in EVALUATOR_DOMAINS and node.domain not in local:
            raise UsageError(
                f"ONNX's reference evaluator cannot run {node.domain}.{node.op_type} (node "
                f"{node.name or node.op_type!r}), an op outside the ONNX standard; use ONNX "
                "Runtime as the reference instead (drop --against-reference-evaluator)")
