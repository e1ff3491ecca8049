"""The interface every runtime implements: :class:`Runner`, and the values it returns.

A runner runs one ONNX file the way a runtime runs it in production, and hands back
what the pipeline, the search and the report need, always as returned values: a run
(:class:`RuntimeRun`: the captured values and :class:`ProductionCheck`, how they were
checked against production's own kernels), production's final outputs alone, a
session on a few nodes copied out of the model (a local check), a probe of production
with a few values made outputs (:class:`CompiledGraph`: what it compiled), and where a
node ran. Nothing is written onto a runner for others to read.

A runtime is a folder (``runtime/onnxruntime/``, ``runtime/openvino/``,
``runtime/reference_evaluator/``) with one :class:`Runner` subclass and, in its
``__init__.py``, its :class:`RuntimeEntry`, listed in :mod:`bisect_onnx.runtime.registry`.
docs/runtimes.md is this module's guide.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo, node_provenance, read_nodes
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.graph.view import GraphView
from bisect_onnx.runtime.input_specs import InputSpec, input_specs
from bisect_onnx.runtime.onnx_files import load_onnx_model
from bisect_onnx.runtime.sides import Capture, CapturedValue, JsonObject
from bisect_onnx.runtime.weights_in_place import model_in_place

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Runner", "ReferenceOnlyRunner", "RunnerSettings", "RuntimeEntry", "RuntimeRun",
           "ProductionCheck", "CompiledGraph", "Session", "SessionOutput", "captured_by_node",
           "PROMOTE_CHOICES"]

#: ``fused``: capture only the values production's compiled graph keeps (the default);
#: ``all``: every node output, which changes what the runtime fuses.
PROMOTE_CHOICES = ("fused", "all")


class SessionOutput(Protocol):
    """One output of a :class:`Session`: ONNX Runtime's ``NodeArg`` face."""

    @property
    def name(self) -> str:
        """The output's value name in the graph."""
        ...


class Session(Protocol):
    """A compiled model that runs: ONNX Runtime's ``InferenceSession`` face."""

    def run(self, output_names: Sequence[str] | None,
            input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The arrays of ``output_names`` (every output for ``None``) on ``input_feed``."""
        ...

    def get_outputs(self) -> Sequence[SessionOutput]:
        """The model's outputs, each with a ``name``."""
        ...


@dataclass(frozen=True)
class RunnerSettings:
    """What a runtime is asked to run with: the command line's ``--provider`` and so on.

    Each runtime takes the settings that are its own and refuses the others
    (:attr:`RuntimeEntry.check`).
    """

    provider: str
    opt_level: str
    promote: str
    precision: str | None = None


@dataclass(frozen=True)
class RuntimeEntry:
    """One runtime: its names, where its kernel bugs go, and how its runner is made.

    Each runtime's folder defines its entry (``runtime/openvino/__init__.py``); the
    registry (:mod:`bisect_onnx.runtime.registry`) lists them.
    """

    name: str
    """The ``--runtime`` choice and the report's ``environment.runtime``."""
    display_name: str
    """How the report's sentences name it."""
    repository: str
    """Where a bug in its kernels is filed."""
    make: Callable[[Path, RunnerSettings], Runner]
    """The runner of a file under these settings (imports the runtime's modules)."""
    check: Callable[[RunnerSettings], None]
    """One-line errors for settings it cannot take, before anything runs."""


@dataclass(frozen=True)
class ProductionCheck:
    """How a capture was checked against production's own kernels, in one run."""

    outputs: tuple[np.ndarray, ...] | None = None
    """Production's final outputs (``None`` where no production run was made: every
    value promoted, which runs no production kernels to check against)."""
    matches: bool | None = None
    """Whether the capture's final outputs are production's (bitwise on CPU)."""
    difference: float | None = None
    """The largest difference of the capture's final outputs from production's."""
    how: str | None = None
    """A sentence: the outputs compared, or the optimized graph found identical."""

    def describe(self) -> JsonObject:
        """The report's ``capture`` fields for it."""
        return {"outputs_match_production": self.matches, "production_check": self.how,
                "production_max_abs_difference": self.difference}


@dataclass(frozen=True)
class RuntimeRun:
    """One run of a runner: every value it captured, and how that was checked."""

    capture: Capture
    production: ProductionCheck = field(default_factory=ProductionCheck)


@dataclass(frozen=True)
class CompiledGraph:
    """What a runtime compiled for a session: op counts, values, and node by node."""

    counts: Counter
    values: set[str]
    nodes: list[tuple]


class Runner(ABC):
    """Runs an ONNX file as one runtime does, its values captured.

    The model is read from ``path`` without its external data and never written to;
    ``nodes``, ``inputs`` and ``output_names`` are its graph's. ``promote`` is
    ``"fused"`` (capture only what production's compiled graph keeps) or ``"all"``
    (every node output: a reference, which changes what the runtime fuses). ``view``
    answers which node computes or reads a value, for every stage.
    """

    #: The runtime's name in the registry, the report's ``environment.runtime``.
    runtime: ClassVar[str]
    #: Whether no two sessions on the whole model may be held at once (each holds every
    #: weight): the comparison then makes them one at a time.
    holds_weights_once: bool = False
    #: Whether making its sessions leaves a core free: the exporter's translations are
    #: imported beside the capture only then (a compiling runtime takes every core).
    prepares_on_one_core: bool = True
    #: The inference precision a compiling runtime computes float32 values in
    #: (``bf16``, ``f16``, ``f32``); ``None``: float32 as the file says.
    precision: str | None = None
    #: How the progress events and the environment record name this runner as the
    #: reference, where not by its runtime's name (ONNX's reference evaluator).
    reference_label: str | None = None
    #: Whether its model is read with the file's large inline weights referenced where
    #: they lie (:func:`~bisect_onnx.runtime.weights_in_place.model_in_place`), not
    #: copied out: only where every reader of the model's weights (its local checks'
    #: sessions, the repro) finds them in the file's folder. OpenVINO reads a local
    #: check's model from bytes, where no external weight is found.
    reads_weights_in_place: ClassVar[bool] = False

    def __init__(self, path: Path, *, promote: str) -> None:
        if promote not in PROMOTE_CHOICES:
            raise ValueError(f"promote must be one of {PROMOTE_CHOICES}, got {promote!r}")
        self.path = Path(path)
        self.promote = promote
        self.model = load_onnx_model(
            self.path, read=model_in_place if self.reads_weights_in_place else None)
        graph = self.model.graph
        self.inputs: list[InputSpec] = input_specs(graph)
        self.nodes: list[NodeInfo] = read_nodes(graph)
        self.view = GraphView.of(self.nodes)
        """The nodes' order, producers and readers, read once for every stage."""
        self.output_names = [value.name for value in graph.output]

    @property
    def opset(self) -> int | None:
        """The default-domain opset the model was exported with."""
        return next((entry.version for entry in self.model.opset_import
                     if entry.domain in ("", "ai.onnx")), None)

    @property
    def provider(self) -> str | None:
        """ONNX Runtime's execution provider, or how another runtime names its device."""
        return None

    @property
    def opt_level(self) -> str | None:
        """ONNX Runtime's optimization level; ``None`` for a runtime without levels."""
        return None

    @property
    def layer_boundaries(self) -> frozenset[str]:
        """Values between two of production's compiled layers the capture cannot ask for.

        Local checks cut at them on the reference's values. Empty where every such
        value can be captured (ONNX Runtime).
        """
        return frozenset()

    @abstractmethod
    def describe(self) -> JsonObject:
        """What this runner is, for the report's ``candidate`` entry."""

    @abstractmethod
    def describe_capture(self, production: ProductionCheck | None) -> JsonObject:
        """How the capture is made, with how a run of it was checked, for the report."""

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> RuntimeRun:
        """One run on ``inputs`` (the graph's inputs in order), every value captured."""

    @abstractmethod
    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """Production as it is, one run: the final outputs only."""

    @abstractmethod
    def with_promotion(self, promote: str) -> Runner:
        """The same file under the same settings, capturing as ``promote`` says."""

    @abstractmethod
    def local_session(self, serialized: bytes, label: str) -> Session:
        """A session on a model of nodes copied out of this one (a local check)."""

    def initializers_in_place(self) -> Mapping[str, bytes] | None:
        """The file's initializers serialized, by name, for a local check's model.

        Each large weight a reference to where it lies in the file, which this runner's
        local sessions read there (nothing copied or serialized); ``None``: the local
        model holds copies of the weights it reads (the default).
        """
        return None

    @abstractmethod
    def probe_session(self, names: Sequence[str] | None) -> tuple[Session, CompiledGraph]:
        """Production with ``names`` made outputs (``None``: production itself).

        With it, what it compiled, which a probe compares with production's.
        """

    @abstractmethod
    def where_it_ran(self, value: str, node: str | None) -> JsonObject:
        """The report's ``culprit.node.ran_in``: the kernel or layer that computed it."""

    def prepare(self) -> None:  # noqa: B027 (a hook: nothing to plan by default)
        """Plan the capture from production's compiled graph, before any run."""

    def prepare_sessions(self) -> None:
        """Plan the capture and make its session ahead of the first run, where it is kept.

        For a caller with other work to do meanwhile (a check hashes the graph's
        weights); :meth:`release` lets go of a session so made and never run. The plan
        alone by default.
        """
        self.prepare()

    def release(self) -> None:  # noqa: B027 (a hook: nothing made ahead by default)
        """Let go of what :meth:`prepare_sessions` made and no run used."""

    def survival(self) -> tuple[int, int] | None:
        """How many of the candidate values production's graph keeps, of how many.

        ``None`` where the runtime does not say; a few survivors make the pipeline
        promote every value instead (a float16 or QDQ file in ONNX Runtime).
        """
        return None

    def optimizer_settings(self) -> dict[str, str] | None:
        """The ONNX Runtime settings the optimizer fix search reruns with, if any."""
        return None

    def captured(self, by_name: Mapping[str, np.ndarray]) -> Capture:
        """The values of one run in graph order, each with its node's provenance."""
        return captured_by_node(self.nodes, self.output_names, by_name)


class ReferenceOnlyRunner(Runner):
    """A runner that is only ever the reference: no sessions to run nodes alone or probe.

    ONNX's reference evaluator, a recorded reference. ``reference_only`` says why, in
    the one-line error a caller that asks gets.
    """

    reference_only: ClassVar[str]

    def local_session(self, serialized: bytes, label: str) -> Session:
        """Not available: a reference is never the runtime under test."""
        from bisect_onnx.errors import UsageError

        raise UsageError(self.reference_only)

    def probe_session(self, names: Sequence[str] | None) -> tuple[Session, CompiledGraph]:
        """Not available: a reference compiles no production graph to probe."""
        from bisect_onnx.errors import UsageError

        raise UsageError(self.reference_only)


def captured_by_node(nodes: Sequence[NodeInfo], output_names: Sequence[str],
                     by_name: Mapping[str, npt.ArrayLike], *, skip_constants: bool = False,
                     provenance: Callable[[NodeInfo, int], Provenance] = node_provenance,
                     ) -> Capture:
    """A run's arrays by name as a :class:`Capture`: node outputs in graph order.

    ``provenance(node, position)`` says where a value came from (a runtime's layer may
    add to the node's own); ``skip_constants``: a Constant's output is no value of its.
    """
    values: dict[str, CapturedValue] = {}
    producers: dict[str, NodeInfo] = {}
    for node in nodes:
        if skip_constants and node.op_type == "Constant":
            continue
        for output in node.outputs:
            if output in by_name and output not in values:
                producers[output] = node
                values[output] = CapturedValue(output, np.asarray(by_name[output]),
                                               provenance(node, len(values)))
    outputs = [CapturedValue(name, np.asarray(by_name[name]),
                             provenance(producers[name], index) if name in producers
                             else Provenance(position=index))
               for index, name in enumerate(output_names)]
    return Capture(values=values, outputs=outputs)
