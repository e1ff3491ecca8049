"""The parts of a report that describe the run and its evidence, as small types.

Each part with a fixed shape is a frozen dataclass whose ``to_dict`` writes the JSON
object schema 2 lays out (docs/json-schema.md), key for key and in the same order, and
whose ``from_dict`` reads that object back (the assembler reads the stages' findings
through it too, so a report made and a report loaded hold the same values). A key the
schema writes only in some runs is left out as the schema says (``search.reason``,
``attribution.nodeless``, ...). A key a part does not know is refused (``TypeError``):
a stage that adds one must add it here, and to the schema.

The descriptions whose keys depend on the runtime or the driver (``environment``,
``reference``, ``candidate``, ``capture``) are :class:`~typing.TypedDict` s: their keys
are open, and each key is optional.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from bisect_onnx.graph.provenance import SourceLocation
from bisect_onnx.runtime.sides import JsonObject

__all__ = ["Environment", "SideDescription", "CaptureDescription", "ReproFolder", "InsideOp",
           "CulpritSegment", "Probe", "Search", "Attribution", "NodeValue", "CulpritNode",
           "FULL_CAPTURE"]


class Environment(TypedDict, total=False):
    """Versions and settings the run used (``environment``); keys as the driver writes."""

    bisect_onnx: str
    torch: str
    onnx: str
    onnxruntime: str
    python: str
    platform: str
    cpu: str
    cpu_count: int | None
    intra_op_threads: str
    reference_runtime: str
    reference_provider: str | None
    reference_opt_level: str | None
    runtime: str
    provider: str | None
    opt_level: str | None
    promote: str
    exporter: str
    opset: int | None


#: One side's description (``reference``, ``candidate``): ``kind``, ``model`` and what the
#: side's runtime or model form adds (``class``, ``producer``, OpenVINO's ``device``...).
SideDescription = dict[str, Any]


class CaptureDescription(TypedDict, total=False):
    """How the candidate's values were captured (``capture``); empty when nothing was."""

    mode: str
    promoted: int | None
    surviving_values: int
    values: int
    disabled_optimizers: list[str]
    fusions_match_production: bool | None
    outputs_match_production: bool | None
    production_check: str | None
    production_max_abs_difference: float | None
    executed_layers: int
    """OpenVINO: production's executed layers (and ``candidates`` to ``rounds`` below)."""
    candidates: int
    captured: int
    dropped: int
    rounds: int
    layers_match_production: bool


@dataclass(frozen=True)
class ReproFolder:
    """Where the minimal repro of the first divergence was written (``repro``)."""

    folder: str
    nodes: tuple[str, ...]
    """The segment's ONNX nodes, in graph order."""
    inputs: Mapping[str, str]
    """Segment input -> where its value came from."""
    reproduces: bool
    """Whether the segment alone reproduces the error."""

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        return {"folder": self.folder, "nodes": list(self.nodes), "inputs": dict(self.inputs),
                "reproduces": self.reproduces}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReproFolder:
        """Read back from the JSON object :meth:`to_dict` writes."""
        return cls(**{**data, "nodes": tuple(data["nodes"]), "inputs": dict(data["inputs"])})


@dataclass(frozen=True)
class InsideOp:
    """Op level: which node inside a multi-node op went wrong, and how (``inside_op``)."""

    fx_node: str
    """The op made of several ONNX nodes."""
    nodes: tuple[str, ...]
    node: str | None
    """The node that went wrong (``None``: it could not be told)."""
    value: str | None
    """That node's output."""
    how: str
    compared: int | None = None
    """Nodes compared inside the op (not written where the search does not count them)."""

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        data = {"fx_node": self.fx_node, "nodes": list(self.nodes), "node": self.node,
                "value": self.value, "how": self.how}
        return data if self.compared is None else {**data, "compared": self.compared}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InsideOp:
        """Read back from the JSON object :meth:`to_dict` writes."""
        return cls(**{**data, "nodes": tuple(data["nodes"])})


@dataclass(frozen=True)
class CulpritSegment:
    """Several nodes shown together, and no single one, to introduce the error."""

    from_values: tuple[str, ...]
    """The segment's input values (JSON ``from``)."""
    to: str
    """The failing value it computes."""
    nodes: tuple[str, ...]
    """Its compute nodes, in graph order."""
    ops: Mapping[str, str]
    """Node -> op type."""
    local_max_abs_error: float | None
    local_nan_mismatch: int | None

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        return {"from": list(self.from_values), "to": self.to, "nodes": list(self.nodes),
                "ops": dict(self.ops), "local_max_abs_error": self.local_max_abs_error,
                "local_nan_mismatch": self.local_nan_mismatch}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CulpritSegment:
        """Read back from the JSON object :meth:`to_dict` writes."""
        values = dict(data)
        from_values = tuple(values.pop("from"))
        return cls(**{**values, "from_values": from_values, "nodes": tuple(values["nodes"]),
                      "ops": dict(values["ops"])})


@dataclass(frozen=True)
class Probe:
    """One probe of the production graph (``search.probes[]``)."""

    values: tuple[str, ...]
    results: Mapping[str, str]
    """Value -> ``pass``, ``fail`` or ``not comparable``."""
    graph: str
    """How the probe's optimized graph compares with production's."""

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        return {"values": list(self.values), "results": dict(self.results),
                "graph": self.graph}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        """Read back from the JSON object :meth:`to_dict` writes."""
        return cls(**{**data, "values": tuple(data["values"]),
                      "results": dict(data["results"])})


#: The search of a run whose every value was captured in one session.
FULL_CAPTURE = "full capture"
_BISECTION = "bisection"


@dataclass(frozen=True)
class Search:
    """Which search found the first divergence (``search``).

    ``full capture`` writes only ``mode``; ``final outputs only`` adds ``reason``;
    ``bisection`` writes every key.
    """

    mode: str = FULL_CAPTURE
    reason: str | None = None
    """Why it was not a full capture."""
    checkpoints: int | None = None
    """Bisection: values with a reference value the probes could look at."""
    probes: tuple[Probe, ...] = ()
    last_passing: str | None = None
    first_failing: str | None = None
    uncompared_between: tuple[str, ...] = ()
    graphs_match_production: bool | None = None

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        data: dict[str, Any] = {"mode": self.mode}
        if self.mode == _BISECTION:
            return {**data, "reason": self.reason, "checkpoints": self.checkpoints,
                    "probes": [probe.to_dict() for probe in self.probes],
                    "last_passing": self.last_passing, "first_failing": self.first_failing,
                    "uncompared_between": list(self.uncompared_between),
                    "graphs_match_production": self.graphs_match_production}
        return data if self.reason is None else {**data, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Search:
        """Read back from the JSON object :meth:`to_dict` writes."""
        return cls(**{**data, "probes": tuple(Probe.from_dict(probe)
                                              for probe in data.get("probes", ())),
                      "uncompared_between": tuple(data.get("uncompared_between", ()))})


@dataclass(frozen=True)
class Attribution:
    """The evidence behind the culprit: how it was found (``attribution``).

    The nested parts (``classification``, ``narrowed``, ``inside_kernel``, ``nodeless``,
    ``unpaired``) are the search steps' own objects, kept as they wrote them.
    """

    noise: tuple[str, ...] = ()
    """Values failing locally by float rounding only."""
    drift: bool = False
    """No failing value's own nodes introduce error beyond rounding."""
    largest_jump: str | None = None
    checked: int = 0
    """Values rerun on the reference's inputs."""
    inputs: Mapping[str, str] | None = None
    """Where each input of the culprit's segment came from."""
    nodes: tuple[str, ...] | None = None
    """The culprit's segment."""
    classification: Mapping[str, Any] | None = None
    """``kind``, ``detail``, ``file_with`` and the float64 figures that decided them."""
    unchecked: Mapping[str, str] = field(default_factory=dict)
    """Failing values that could not be rerun, and why."""
    narrowed: Mapping[str, Any] | None = None
    """A segment's node named by its run alone: ``segment``, ``node``, ``alone``..."""
    passed_alone: tuple[str, ...] | None = None
    inside_kernel: Mapping[str, Any] | None = None
    """A culprit inside a kernel the runtime fused: ``value``, ``node``, ``kernel_output``."""
    nodeless: Mapping[str, Any] | None = None
    """A PyTorch computation with no ONNX node as the culprit (``value``, ``before``...)."""
    unpaired: Mapping[str, Any] | None = None
    """A node with no counterpart in the reference as the culprit (``reads``, ``fed``...)."""
    baked_shapes: Mapping[str, Any] | None = None
    """Where the export baked in the shapes it was made at (checked): the nodes, their
    modules and source lines, the advice (see docs/how-it-decides.md)."""
    within_tolerance: Mapping[str, Any] | None = None
    """With drift: the value upstream whose own node, fed the reference's inputs,
    reproduces its error, beyond rounding but within tolerance (``value``, ``node``,
    ``max_abs_error``, ``local_max_abs_error``, ``scale``)."""
    first_culprit: str | None = None
    """The culprit's value (not written: the JSON's ``culprit`` names it)."""

    def to_dict(self) -> JsonObject:
        """The JSON's ``attribution`` (without ``inside_op``, which the report adds)."""
        data = {"noise": list(self.noise), "drift": self.drift,
                "largest_jump": self.largest_jump, "checked": self.checked,
                "inputs": dict(self.inputs) if self.inputs is not None else None,
                "nodes": list(self.nodes) if self.nodes is not None else None,
                "classification": self.classification, "unchecked": dict(self.unchecked),
                "narrowed": self.narrowed,
                "passed_alone": list(self.passed_alone) if self.passed_alone is not None
                else None, "baked_shapes": self.baked_shapes}
        # A culprit with no ONNX node has no kernel: that search writes it so, as null.
        if self.inside_kernel is not None or self.nodeless is not None:
            data["inside_kernel"] = self.inside_kernel
        if self.nodeless is not None:
            data["nodeless"] = self.nodeless
        if self.unpaired is not None:
            data["unpaired"] = self.unpaired
        if self.within_tolerance is not None:
            data["within_tolerance"] = self.within_tolerance
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], first_culprit: str | None) -> Attribution:
        """The evidence ``data`` holds (a search's, or the JSON's less ``inside_op``)."""
        values = dict(data)
        for name in ("noise", "nodes", "passed_alone"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        for name in ("inputs", "unchecked"):
            if values.get(name) is not None:
                values[name] = dict(values[name])
        return cls(**{**values, "first_culprit": first_culprit})


@dataclass(frozen=True)
class NodeValue:
    """One input or output of the culprit's node (``culprit.node.inputs[]``)."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    source: str
    """``reference``, ``initializer``, ``graph_input`` or ``candidate``."""

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        return {"name": self.name, "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeValue:
        """Read back from the JSON object :meth:`to_dict` writes."""
        shape = data["shape"]
        return cls(**{**data, "shape": tuple(shape) if shape is not None else None})


@dataclass(frozen=True)
class CulpritNode:
    """The culprit's ONNX node in its graph (``culprit_node``; the JSON's ``culprit.node``).

    Described for the first divergence when no culprit was found. ``node``,
    ``torch_module``, ``torch_op`` and ``source`` are its record's: the JSON writes them
    once, in the record.
    """

    node: str
    op_type: str
    domain: str
    """``ai.onnx`` for the default domain."""
    attributes: Mapping[str, str]
    """Attribute name -> its value as text."""
    inputs: tuple[NodeValue, ...]
    outputs: tuple[NodeValue, ...]
    ran_in: Mapping[str, Any]
    """Where production ran it: the runtime's own keys (ONNX Runtime's kernel, OpenVINO's
    executed layer)."""
    torch_module: str | None = None
    torch_op: str | None = None
    source: SourceLocation | None = None

    #: The keys the record gives (written once, in the record).
    RECORD_KEYS = ("node", "torch_module", "torch_op", "source")

    def to_dict(self) -> JsonObject:
        """The JSON object schema 2 writes."""
        return {"node": self.node, "op_type": self.op_type, "domain": self.domain,
                "attributes": dict(self.attributes),
                "inputs": [value.to_dict() for value in self.inputs],
                "outputs": [value.to_dict() for value in self.outputs],
                "ran_in": self.ran_in, "torch_module": self.torch_module,
                "torch_op": self.torch_op,
                "source": self.source.to_dict() if self.source else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CulpritNode:
        """Read back from the JSON object :meth:`to_dict` writes."""
        source = data.get("source")
        return cls(**{**data, "attributes": dict(data["attributes"]),
                      "inputs": _values(data["inputs"]), "outputs": _values(data["outputs"]),
                      "source": SourceLocation.from_dict(source) if source else None})


def _values(data: Sequence[Mapping[str, Any]]) -> tuple[NodeValue, ...]:
    return tuple(NodeValue.from_dict(item) for item in data)
