"""ONNX Runtime's runner: promote the node outputs production keeps, run one session.

The model the user gave is read without its external data and never written to.
A promoted copy (every top-level node output appended as a graph output) is handed
to ONNX Runtime as bytes, with the user's folder named as the place to find external
weights, so nothing lands next to the user's model.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.graph.walk import graph_tensors
from bisect_onnx.graph.weights import external_location, weight_bytes
from bisect_onnx.runtime.onnx_files import file_key
from bisect_onnx.runtime.onnxruntime.capture_plan import (
    CapturePlan,
    check_capture_graph,
    graph_nodes,
    matches_production,
    op_counts,
    plan_capture,
    session_and_graph,
)
from bisect_onnx.runtime.onnxruntime.placement import Kernel, ProfileFolder, ran_in, read_kernels
from bisect_onnx.runtime.onnxruntime.sessions import (
    CPU_PROVIDER,
    DEFAULT_OPT_LEVEL,
    SessionSettings,
    check_runtime,
    create_session,
    refusal,
)
from bisect_onnx.runtime.runner import (
    CompiledGraph,
    ProductionCheck,
    Runner,
    RuntimeRun,
    Session,
)
from bisect_onnx.runtime.sides import CapturedValue, JsonObject
from bisect_onnx.runtime.weights_in_place import initializers_in_place, weights_in_place

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["OnnxRuntimeRunner"]

logger = logging.getLogger(__name__)

#: Past this many bytes of weights, the production and the capture session are never
#: held at once: two sessions hold the weights twice (prepacked), on top of PyTorch's
#: copy, and memory runs out before time does. Below it both are kept for every random
#: sample rather than made again for each.
HOLD_WEIGHTS_ONCE_ABOVE = 2**30


class OnnxRuntimeRunner(Runner):
    """Runs an ONNX model in ONNX Runtime with its intermediate values promoted to outputs.

    Only the values production's optimized graph keeps, by default (``promote="fused"``,
    :mod:`bisect_onnx.runtime.onnxruntime.capture_plan`); every node output with
    ``promote="all"``.
    """

    runtime = "onnxruntime"
    reads_weights_in_place = True

    def __init__(
        self,
        path: Path,
        *,
        provider: str = CPU_PROVIDER,
        opt_level: str = DEFAULT_OPT_LEVEL,
        promote: str = "fused",
    ) -> None:
        check_runtime(provider, opt_level, promote)
        self._read_as = file_key(Path(path))  # the file as its model was read
        super().__init__(path, promote=promote)
        self._provider = provider
        self._opt_level = opt_level
        self.plan: CapturePlan | None = None
        self._promoted_session: ort.InferenceSession | None = None
        self._profile: ProfileFolder | None = None
        self.kernels: dict[str, Kernel] | None = None
        """The capture session's kernels by node, from its first run's profile."""
        self._in_place: dict[str, bytes] | None = None  # (initializers_in_place)
        # Where the model was read in place, its large weights are read from the file:
        # one written since is refused rather than mixed with what was read before.
        self._weights_in_file = any(external_location(tensor) == self.path.resolve().name
                                    for tensor in self.model.graph.initializer)
        self.holds_weights_once = (weight_bytes(graph_tensors(self.model.graph))
                                   > HOLD_WEIGHTS_ONCE_ABOVE)
        """Whether no two sessions on the whole model may exist at once (each holds
        every weight, prepacked): then each is made for a run and released after it."""

    @property
    def provider(self) -> str:
        """The execution provider every session of this runner is made on."""
        return self._provider

    @property
    def opt_level(self) -> str:
        """The graph optimization level every session of this runner is made at."""
        return self._opt_level

    def describe(self) -> JsonObject:
        """What this runner is, for the report."""
        return {
            "kind": self.runtime,
            "model": str(self.path),
            "producer": f"{self.model.producer_name} {self.model.producer_version}".strip(),
            "graph": self.model.graph.name,
            "nodes": len(self.nodes),
            "provider": self.provider,
            "opt_level": self.opt_level,
        }

    def describe_capture(self, production: ProductionCheck | None) -> JsonObject:
        """How the capture was made and checked, for the report."""
        if self.plan is None:
            return {}
        return {**self.plan.describe(), **(production or ProductionCheck()).describe()}

    def with_promotion(self, promote: str) -> OnnxRuntimeRunner:
        """The same file, provider and level, capturing as ``promote`` says."""
        return OnnxRuntimeRunner(self.path, provider=self.provider, opt_level=self.opt_level,
                                 promote=promote)

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """One plain session (nothing promoted) and one run: the final outputs only."""
        session = self._session(self.file_source())  # nothing to serialize
        arrays = self._run(session, [value.name for value in session.get_outputs()], inputs)
        return [CapturedValue(name, np.asarray(array), Provenance(position=index))
                for index, (name, array) in enumerate(zip(self.output_names, arrays,
                                                          strict=True))]

    def prepare(self) -> CapturePlan:
        """What the capture will promote, from production's optimized graph (made once)."""
        if self.plan is None:
            self.plan = plan_capture(self.model, self.path, source=self.file_source(),
                                     promote=self.promote,
                                     provider=self.provider, opt_level=self.opt_level,
                                     label=self.path.name)
        return self.plan

    def prepare_sessions(self) -> None:
        """The plan, and the capture session where it is kept for the run (not a big model's)."""
        self.prepare()
        if not self.holds_weights_once:
            self._capture_session()

    def release(self) -> None:
        """The capture session let go of, and its profile's folder where no run read it."""
        self._promoted_session = None  # first: it writes its profile as it goes
        if self._profile is not None:
            self._profile.remove()
            self._profile = None

    def survival(self) -> tuple[int, int] | None:
        """How many candidate values production's optimized graph keeps, of how many."""
        plan = self.prepare()  # decided from production's graph, before any capture
        if plan.promoted is None or not plan.values:
            return None
        return plan.survivors, plan.values

    def run(self, inputs: Sequence[np.ndarray]) -> RuntimeRun:
        """One session, one run, every promoted value fetched.

        Inputs feed the graph's inputs in order, keyword or not: an export names and
        orders its inputs as the model was called.
        """
        plan = self.prepare()
        expected = None
        if plan.promoted is not None and not plan.production_nodes:
            # The capture mirrors another graph (NCHWc disabled): production must run.
            # It runs first and goes, so that a big model's session and its capture's,
            # each with every weight, are never held together (a smaller model's capture
            # session may have been made ahead: prepare_sessions).
            expected = self._production_outputs(inputs, release=True)
        session = self._capture_session()
        fetched = [output.name for output in session.get_outputs()]
        try:
            by_name = dict(zip(fetched, self._run(session, fetched, inputs), strict=True))
        finally:
            if self._profile is not None:  # one profiled run says where each kernel ran
                self.kernels, self._profile = read_kernels(session, self._profile), None
        if self.holds_weights_once:  # what follows (local checks, repro) goes without it
            self._promoted_session = None
        logger.info("ONNX Runtime produced %d values", len(by_name))
        how = None
        if plan.same_graph_as_production:
            # The very kernels of production ran, on the same inputs: its outputs are
            # these, and a production session would only repeat them.
            expected = [by_name[name] for name in self.output_names]
            how = "identical optimized graph"
        elif self.promote != "all":  # (a big model's capture session is gone by now)
            if expected is None:
                expected = self._production_outputs(inputs, release=self.holds_weights_once)
            how = "outputs compared" + (
                " bitwise" if self.provider == CPU_PROVIDER else " within a tight tolerance")
        if expected is None:
            production = ProductionCheck()
        else:
            matches, difference = matches_production(
                self.output_names, by_name, expected, exact=self.provider == CPU_PROVIDER)
            production = ProductionCheck(tuple(expected), matches, difference, how)
        return RuntimeRun(self.captured(by_name), production)

    def _production_outputs(self, inputs: Sequence[np.ndarray], *, release: bool) -> list:
        """Production's final outputs on ``inputs``, from a plain session.

        ``release``: let the session go after the run (another sample makes it again).
        """
        if self.plan.production_session is None:  # made when first needed
            self.plan.production_session = self._session(self.file_source())
        expected = self._run(self.plan.production_session, self.output_names, inputs)
        if release:
            self.plan.production_session = None
        return expected

    def _capture_session(self) -> ort.InferenceSession:
        """The promoted session: one for every run, unless the weights are held once."""
        if self._promoted_session is not None:
            return self._promoted_session
        promoted = self.promoted_bytes(self.plan.promoted)
        self._profile = ProfileFolder() if self.kernels is None else None
        try:
            if self.promote == "all" or self.plan.capture_ops:  # nothing (more) to check
                self._promoted_session = self._session(
                    promoted, disabled=self.plan.disabled_optimizers, profile=self._profile)
            else:
                self._promoted_session = check_capture_graph(
                    self.plan, promoted, self.path.resolve().parent, provider=self.provider,
                    opt_level=self.opt_level, label=self.path.name, profile=self._profile)
        except BaseException:  # no session, no profile: its folder goes now
            if self._profile is not None:
                self._profile.remove()
                self._profile = None
            raise
        return self._promoted_session

    @property
    def session_settings(self) -> SessionSettings:
        """The provider and level of every session of this runner, no optimizer disabled."""
        return SessionSettings(self.provider, self.opt_level)

    def _session(self, serialized: bytes | Path, disabled: Sequence[str] = (),
                 profile: ProfileFolder | None = None) -> ort.InferenceSession:
        return create_session(serialized, model_dir=self.path.resolve().parent,
                              label=self.path.name, settings=SessionSettings(
                                  self.provider, self.opt_level, tuple(disabled)),
                              profile=profile)

    def local_session(self, serialized: bytes, label: str) -> Session:
        """A local check's model in a session on this runner's provider and level."""
        return create_session(serialized, model_dir=self.path.resolve().parent, label=label,
                              settings=self.session_settings)

    def initializers_in_place(self) -> Mapping[str, bytes] | None:
        """The file's initializers, each large one referenced where it lies in the file.

        A local check's model with its weights copied in and serialized took ResNet-50's
        parity check 0.15 s a session, and ONNX Runtime's reading of them again more:
        referenced, they are read from the file (mapped), the same values bitwise. Read
        once; ``None`` where the file is not as its model was read.
        """
        self._check_unchanged()
        if self._in_place is None or file_key(self.path) != self._read_as:
            self._in_place = initializers_in_place(self.path, self._read_as)
        return self._in_place

    def probe_session(self, names: Sequence[str] | None) -> tuple[Session, CompiledGraph]:
        """A session marking ``names`` (production for ``None``), and its optimized graph.

        ORT writes that graph's weights to the null device where it can
        (:func:`~bisect_onnx.runtime.onnxruntime.sessions.create_session`): a probe
        costs no weight write.
        """
        # The user's file for production; a copy with a few more outputs for a probe.
        source = self.file_source() if names is None else self.promoted_bytes(set(names))
        with tempfile.TemporaryDirectory(prefix="bisect-onnx-probe-") as folder:
            session, optimized = session_and_graph(
                source, self.path.resolve().parent, Path(folder), self.session_settings,
                self.path.name)
        return session, CompiledGraph(Counter(op_counts(optimized)),
                                      {name for node in optimized.graph.node
                                       for name in node.output},
                                      graph_nodes(optimized))

    def where_it_ran(self, value: str, node: str | None) -> JsonObject:
        """The capture's kernel computing ``value`` and its provider, from the profile.

        Without a profile only the CPU provider is certain: with another, nodes it
        lacks kernels for fall back to the CPU, so the provider is left ``None``.
        """
        kernel = None
        if self.kernels:
            producers = self.plan.capture_producers if self.plan is not None else {}
            kernel = ran_in(value, node, self.model, self.kernels, producers)
        if kernel is not None:
            return {"runtime": self.runtime, "provider": kernel.pop("provider"),
                    "kernel": kernel}
        return {"runtime": self.runtime,
                "provider": self.provider if self.provider == CPU_PROVIDER else None,
                "kernel": None}

    def optimizer_settings(self) -> dict[str, str] | None:
        """The provider and level the optimizer fix search reruns with."""
        return {"provider": self.provider, "opt_level": self.opt_level}

    def _run(self, session: ort.InferenceSession, fetched: list[str],
             inputs: Sequence[np.ndarray]) -> list:
        feeds = {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}
        try:
            return session.run(fetched, feeds)
        except Exception as error:
            raise refusal(f"ONNX Runtime failed to run {self.path.name}", error) from error

    def file_source(self) -> bytes | Path:
        """What a session on the file as it is is made from: its weights where they lie.

        The file's bytes with each large inline weight referenced where it lies in the
        file (:mod:`bisect_onnx.runtime.weights_in_place`), which ONNX Runtime neither
        copies nor parses again (BERT-base's planning session: 0.12 s, from the path
        0.31 s); the path where the file is not as its model was read.
        """
        self._check_unchanged()
        in_place = weights_in_place(self.path, self._read_as)
        return self.path if in_place is None else in_place

    def _check_unchanged(self) -> None:
        """Refuse a file written since its model was read, where its weights are read from it.

        The model holds references to where its large weights lie in the file
        (:attr:`reads_weights_in_place`): a session made now would mix the file as it is
        with the graph as it was.
        """
        if self._weights_in_file and file_key(self.path) != self._read_as:
            raise InputError(f"{self.path} was written again while it was compared (its "
                             "weights are read from it); run again once it is written")

    def promoted_bytes(self, wanted: set[str] | None = None) -> bytes:
        """The model serialized with its top-level node outputs also graph outputs.

        ``wanted`` limits them to those names (fusion-preserving capture).

        Where the file is as its model was read, its own bytes, its large inline
        weights referenced where they lie in it (:mod:`bisect_onnx.runtime.weights_in_place`),
        else the model read serialized; after them, a message adding the outputs:
        protobuf merges a message read twice, appending to a repeated field. Plain
        untyped ``ValueInfoProto`` outputs, which ORT is content with.
        """
        import onnx

        graph = self.model.graph
        present = {value.name for value in graph.output}
        present.update(value.name for value in graph.input)
        added = []
        for node in graph.node:
            if node.op_type == "Constant":  # a constant cannot diverge
                continue
            for output in node.output:
                if output and output not in present and (wanted is None or output in wanted):
                    added.append(onnx.ValueInfoProto(name=output))
                    present.add(output)
        self._check_unchanged()
        in_place = weights_in_place(self.path, self._read_as)
        outputs = onnx.ModelProto(graph=onnx.GraphProto(output=added)).SerializeToString()
        # (The model read is never changed: a check's digest reads it from a thread.)
        return (self.model.SerializeToString() if in_place is None else in_place) + outputs
