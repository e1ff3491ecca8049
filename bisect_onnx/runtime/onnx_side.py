"""The ONNX Runtime candidate side: promote node outputs, run one session.

The model the user gave is read without its external data and never written to.
A promoted copy (every top-level node output appended as a graph output) is handed
to ONNX Runtime as bytes, with the user's folder named as the place to find external
weights, so nothing lands next to the user's model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bisect_onnx.errors import ModelError, one_line
from bisect_onnx.graph.provenance import Provenance, TorchMetadata, read_torch_metadata
from bisect_onnx.graph.walk import graph_tensors, subgraphs
from bisect_onnx.graph.weights import weight_bytes
from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.runtime.capture_plan import (
    CapturePlan,
    check_capture_graph,
    plan_capture,
)
from bisect_onnx.runtime.input_specs import InputSpec, input_specs
from bisect_onnx.runtime.onnx_files import load_onnx_model
from bisect_onnx.runtime.placement import Kernel, ProfileFolder, ran_in, read_kernels
from bisect_onnx.runtime.sessions import (
    CPU_PROVIDER,
    DEFAULT_OPT_LEVEL,
    OPT_LEVELS,
    check_runtime,
    create_session,
)
from bisect_onnx.runtime.sides import Capture, CapturedValue

__all__ = ["InputSpec", "NodeInfo", "OnnxRuntimeSide", "load_onnx_model", "input_specs",
           "create_session", "CPU_PROVIDER", "DEFAULT_OPT_LEVEL", "OPT_LEVELS", "graph_tensors",
           "subgraphs"]

logger = logging.getLogger(__name__)

# Capture against production on providers that are not bitwise deterministic.
GPU_RTOL = 1e-5
GPU_ATOL = 1e-6
#: Past this many bytes of weights, the production and the capture session are never
#: held at once: two sessions hold the weights twice (prepacked), on top of PyTorch's
#: copy, and memory runs out before time does. Below it both are kept for every random
#: sample rather than made again for each.
HOLD_WEIGHTS_ONCE_ABOVE = 2**30


@dataclass(frozen=True)
class NodeInfo:
    """One top-level ONNX node with the torch exporter's metadata, if any."""

    index: int
    name: str
    op_type: str
    outputs: tuple[str, ...]
    torch: TorchMetadata | None
    inputs: tuple[str, ...] = ()


class OnnxRuntimeSide:
    """Runs an ONNX model in ONNX Runtime with its intermediate values promoted to outputs.

    Only the values production's optimized graph keeps, by default (``promote="fused"``,
    :mod:`bisect_onnx.runtime.capture_plan`); every node output with ``promote="all"``.
    """

    def __init__(
        self,
        path: Path,
        *,
        provider: str = CPU_PROVIDER,
        opt_level: str = DEFAULT_OPT_LEVEL,
        promote: str = "fused",
    ) -> None:
        check_runtime(provider, opt_level, promote)
        self.path = Path(path)
        self.provider = provider
        self.opt_level = opt_level
        self.promote = promote
        self.plan: CapturePlan | None = None
        self.production_difference: float | None = None
        """The largest difference from production's outputs, when they differ."""
        self.outputs_match_production: bool | None = None
        """Whether the last capture run's final outputs equal the production session's
        (bitwise on CPU; within a tight tolerance on other providers)."""
        self.production_outputs: list | None = None
        """The production session's final outputs in the last run (``None`` where
        nothing is fused: ``promote="all"``)."""
        self.production_check: str | None = None
        """How the capture was checked against production in the last run: its final
        outputs compared with a production run's, or its optimized graph found to be
        production's node for node (then production is not run again)."""
        self.model = load_onnx_model(self.path)
        graph = self.model.graph
        self.inputs = input_specs(graph)
        self.nodes = [
            NodeInfo(
                index=index,
                name=node.name or f"{node.op_type}_{index}",
                op_type=node.op_type,
                outputs=tuple(node.output),
                torch=read_torch_metadata({p.key: p.value for p in node.metadata_props}),
                inputs=tuple(node.input),
            )
            for index, node in enumerate(graph.node)
        ]
        self.output_names = [value.name for value in graph.output]
        self._promoted_session: Any = None
        self._profile: ProfileFolder | None = None
        self.kernels: dict[str, Kernel] | None = None
        """The capture session's kernels by node, from its first run's profile."""
        self._hold_weights_once = (weight_bytes(graph_tensors(graph))
                                   > HOLD_WEIGHTS_ONCE_ABOVE)
        """Whether no two sessions on the whole model may exist at once (each holds
        every weight, prepacked): then each is made for a run and released after it."""

    @property
    def holds_weights_once(self) -> bool:
        """Whether the model is large enough that its sessions are made one at a time."""
        return self._hold_weights_once

    @property
    def opset(self) -> int | None:
        """The default-domain opset the model was exported with."""
        for entry in self.model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                return entry.version
        return None

    def describe(self) -> dict[str, Any]:
        """What this side is, for the report."""
        return {
            "kind": "onnxruntime",
            "model": str(self.path),
            "producer": f"{self.model.producer_name} {self.model.producer_version}".strip(),
            "graph": self.model.graph.name,
            "nodes": len(self.nodes),
            "provider": self.provider,
            "opt_level": self.opt_level,
        }

    def describe_capture(self) -> dict[str, Any]:
        """How the capture was made, for the report."""
        if self.plan is None:
            return {}
        return {**self.plan.describe(), "outputs_match_production": self.outputs_match_production,
                "production_check": self.production_check,
                "production_max_abs_difference": self.production_difference}

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """One plain session (nothing promoted) and one run: the final outputs only."""
        session = self._session(self.path)  # ORT reads the file: nothing to serialize
        arrays = self._run(session, [value.name for value in session.get_outputs()], inputs)
        return [CapturedValue(name, np.asarray(array), Provenance(position=index))
                for index, (name, array) in enumerate(zip(self.output_names, arrays,
                                                          strict=True))]

    def prepare(self) -> CapturePlan:
        """What the capture will promote, from production's optimized graph (made once)."""
        if self.plan is None:
            self.plan = plan_capture(self.model, self.path, promote=self.promote,
                                     provider=self.provider, opt_level=self.opt_level,
                                     label=self.path.name)
        return self.plan

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """One session, one run, every promoted value fetched.

        Inputs feed the graph's inputs in order, keyword or not: an export names and
        orders its inputs as the model was called.
        """
        self.prepare()
        expected = None
        if self.plan.promoted is not None and not self.plan.production_nodes:
            # The capture mirrors another graph (NCHWc disabled): production must run.
            # It runs first and goes, so that its session and the capture's, each with
            # every weight, are never held together.
            expected = self._production_outputs(inputs, release=True)
        session = self._capture_session()
        fetched = [output.name for output in session.get_outputs()]
        try:
            by_name = dict(zip(fetched, self._run(session, fetched, inputs), strict=True))
        finally:
            if self._profile is not None:  # one profiled run says where each kernel ran
                self.kernels, self._profile = read_kernels(session, self._profile), None
        if self._hold_weights_once:  # what follows (local checks, repro) goes without it
            self._promoted_session = None
        logger.info("ONNX Runtime produced %d values", len(by_name))
        self.production_check = None
        if self.plan.same_graph_as_production:
            # The very kernels of production ran, on the same inputs: its outputs are
            # these, and a production session would only repeat them.
            expected = [by_name[name] for name in self.output_names]
            self.production_check = "identical optimized graph"
        elif self.promote != "all":  # (a big model's capture session is gone by now)
            if expected is None:
                expected = self._production_outputs(inputs, release=self._hold_weights_once)
            self.production_check = "outputs compared" + (
                " bitwise" if self.provider == CPU_PROVIDER else " within a tight tolerance")
        self.production_outputs = expected
        self.outputs_match_production = (None if expected is None
                                         else self._matches_production(by_name, expected))
        return self._capture(by_name)

    def _production_outputs(self, inputs: Sequence[np.ndarray], *, release: bool) -> list:
        """Production's final outputs on ``inputs``, from a plain session.

        ``release``: let the session go after the run (another sample makes it again).
        """
        if self.plan.production_session is None:  # made when first needed
            self.plan.production_session = self._session(self.path)
        expected = self._run(self.plan.production_session, self.output_names, inputs)
        if release:
            self.plan.production_session = None
        return expected

    def _capture_session(self) -> Any:
        """The promoted session: one for every run, unless the weights are held once."""
        if self._promoted_session is not None:
            return self._promoted_session
        promoted = self.promoted_bytes(self.plan.promoted)
        self._profile = ProfileFolder() if self.kernels is None else None
        if self.promote == "all" or self.plan.capture_ops:  # nothing (more) to check
            self._promoted_session = self._session(
                promoted, disabled=self.plan.disabled_optimizers, profile=self._profile)
        else:
            self._promoted_session = check_capture_graph(
                self.plan, promoted, self.path.resolve().parent, provider=self.provider,
                opt_level=self.opt_level, label=self.path.name, profile=self._profile)
        return self._promoted_session

    def _matches_production(self, by_name: dict[str, Any], expected: Sequence[Any]) -> bool:
        """Whether the capture's final outputs are what the production session computed."""
        exact = self.provider == CPU_PROVIDER
        for name, array in zip(self.output_names, expected, strict=True):
            got = np.asarray(by_name[name])
            array = np.asarray(array)
            # Bitwise on CPU; GPU providers are not deterministic run to run.
            same = (np.array_equal(got, array, equal_nan=True) if exact
                    else compare_arrays(array, got, rtol=GPU_RTOL, atol=GPU_ATOL).passed)
            if not same:
                self.production_difference = (
                    float(np.nanmax(np.abs(got.astype(np.float64) - array)))
                    if got.shape == array.shape and got.dtype.kind in "fc" and got.size
                    else None)
                logger.info("the capture session's output %s differs from production's "
                            "(max abs %s)", name, self.production_difference)
                return False
        return True

    def _session(self, serialized: bytes | Path, disabled: Sequence[str] = (),
                 profile: ProfileFolder | None = None) -> Any:
        return create_session(serialized, model_dir=self.path.resolve().parent,
                              label=self.path.name, provider=self.provider,
                              opt_level=self.opt_level, disabled_optimizers=disabled,
                              profile=profile)

    def kernel_that_ran(self, value: str, node: str | None) -> dict[str, Any] | None:
        """Where the capture's kernel computing ``value`` ran (``None``: not profiled)."""
        if not self.kernels:
            return None
        producers = self.plan.capture_producers if self.plan is not None else {}
        return ran_in(value, node, self.model, self.kernels, producers)

    def _run(self, session: Any, fetched: list[str], inputs: Sequence[np.ndarray]) -> list:
        feeds = {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}
        try:
            return session.run(fetched, feeds)
        except Exception as error:
            raise ModelError(f"ONNX Runtime failed to run {self.path.name}: {one_line(error)}") \
                from error

    def _capture(self, by_name: dict[str, Any]) -> Capture:
        values: dict[str, CapturedValue] = {}
        producers: dict[str, NodeInfo] = {}
        for node in self.nodes:
            for output in node.outputs:
                if output in by_name and output not in values:
                    producers[output] = node
                    values[output] = CapturedValue(
                        output, np.asarray(by_name[output]), node_provenance(node, len(values))
                    )
        outputs = [
            CapturedValue(
                name,
                np.asarray(by_name[name]),
                node_provenance(producers[name], index) if name in producers
                else Provenance(position=index),
            )
            for index, name in enumerate(self.output_names)
        ]
        return Capture(values=values, outputs=outputs)

    def promoted_bytes(self, wanted: set[str] | None = None) -> bytes:
        """The model serialized with its top-level node outputs also graph outputs.

        ``wanted`` limits them to those names (fusion-preserving capture).

        The outputs are appended to the loaded model only for the serialization, not
        to a copy: a copy would hold every inline weight a second time. Plain protos
        rather than onnx-graphsurgeon: its exporter wants typed outputs and would pull
        every external weight into memory, while ORT is content with untyped
        ``ValueInfoProto`` outputs.
        """
        import onnx

        outputs = self.model.graph.output
        original = len(outputs)
        present = {value.name for value in outputs}
        present.update(value.name for value in self.model.graph.input)
        try:
            for node in self.model.graph.node:
                if node.op_type == "Constant":  # a constant cannot diverge
                    continue
                for output in node.output:
                    if output and output not in present and (wanted is None
                                                             or output in wanted):
                        outputs.append(onnx.ValueInfoProto(name=output))
                        present.add(output)
            return self.model.SerializeToString()
        finally:
            del outputs[original:]


def node_provenance(node: NodeInfo, position: int) -> Provenance:
    """What an ONNX node says about where its output came from."""
    meta = node.torch
    return Provenance(
        position=position,
        module=meta.scopes[-1] if meta and meta.scopes else None,
        node=node.name,
        node_op=node.op_type,
        torch_op=meta.torch_op if meta else None,
        source=meta.source if meta else None,
    )
