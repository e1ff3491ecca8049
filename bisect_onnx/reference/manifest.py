"""The manifest of a reference archive: what each member is, and what a report row shows.

A JSON object (docs/reference-format.md): ``format`` and ``version`` first, read before
anything else; then the graph's digest, the inputs, the values (each ONNX value name
with its member), the report's rows with their provenance (ONNX node, torch op,
module, source line, FX node), the tolerance, the coverage and the environment of the
recording. A manifest that does not hold what this version says is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bisect_onnx.align.quantization import Conversion
from bisect_onnx.errors import InputError
from bisect_onnx.graph.provenance import SourceLocation
from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.reference.graph_digest import GraphDigest
from bisect_onnx.runtime.sides import JsonObject

__all__ = ["FORMAT", "VERSION", "PYTORCH", "ONNX", "ArrayEntry", "RowProvenance", "Manifest",
           "check_header"]

FORMAT = "bisect-onnx-reference"
#: Version 2 added ``converted``: a reader of version 1 would compare those values by
#: name, unconverted, and fail them; it refuses version 2 instead. An archive with no
#: converted value is written as version 1, which that reader reads right.
VERSION = 2
#: The versions read: version 1 is version 2 without ``converted``.
READ_VERSIONS = (1, 2)
#: ``reference_kind``: PyTorch's values, or a reference ONNX file's.
PYTORCH, ONNX = "pytorch", "onnx"
#: How a value recorded under a QDQ candidate's name is converted before it is compared.
_CONVERSIONS = frozenset({"dequantized", "requantized"})


@dataclass(frozen=True)
class ArrayEntry:
    """One recorded array: an input by graph input name, or a value by ONNX value name."""

    name: str
    member: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> JsonObject:
        """As the manifest holds it."""
        return {"name": self.name, "member": self.member, "dtype": self.dtype,
                "shape": list(self.shape)}


@dataclass(frozen=True)
class RowProvenance:
    """What a report row shows of a value, besides its figures: where it came from."""

    onnx_value: str
    onnx_node: str | None = None
    onnx_op: str | None = None
    torch_module: str | None = None
    torch_op: str | None = None
    source: SourceLocation | None = None
    fx_node: str | None = None
    rtol: float | None = None
    atol: float | None = None
    """The tolerance the row was judged by, where it was not the report's."""

    @classmethod
    def of(cls, record: Record) -> RowProvenance:
        """A report row's provenance."""
        return cls(record.onnx_value, record.onnx_node, record.onnx_op, record.torch_module,
                   record.torch_op, record.source, record.fx_node, record.figures.rtol,
                   record.figures.atol)

    def shown_on(self, record: Record, index: int) -> Record:
        """``record`` (the check's figures) as the recorded row showed it, at ``index``."""
        return replace(record, index=index, torch_module=self.torch_module, torch_op=self.torch_op,
                       source=self.source, fx_node=self.fx_node,
                       onnx_node=record.onnx_node or self.onnx_node,
                       onnx_op=record.onnx_op or self.onnx_op,
                       match=replace(record.match, reference_value=None, reference_node=None))

    def to_json(self) -> JsonObject:
        """As the manifest holds it."""
        return {"onnx_value": self.onnx_value, "onnx_node": self.onnx_node,
                "onnx_op": self.onnx_op, "torch_module": self.torch_module,
                "torch_op": self.torch_op,
                "source": self.source.to_dict() if self.source else None,
                "fx_node": self.fx_node, "rtol": self.rtol, "atol": self.atol}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RowProvenance:
        """The provenance :meth:`to_json` gave; the value's name is required, the rest not."""
        if not isinstance(data["onnx_value"], str):
            raise ValueError(f"onnx_value {data['onnx_value']!r} is not a value's name")
        source = data.get("source")
        return cls(**{**{key: data.get(key) for key in (
            "onnx_value", "onnx_node", "onnx_op", "torch_module", "torch_op", "fx_node",
            "rtol", "atol")}, "source": SourceLocation.from_dict(source) if source else None})


@dataclass(frozen=True)
class Manifest:
    """Everything a reference archive says about its arrays and the run that recorded them."""

    graph: GraphDigest
    inputs: tuple[ArrayEntry, ...]
    """The recorded inputs, in the graph's input order."""
    values: tuple[ArrayEntry, ...]
    """PyTorch's values by ONNX value name (final outputs by graph output name)."""
    rows: tuple[RowProvenance, ...]
    """The report's comparison rows, in its order (several may show one value)."""
    final_outputs: tuple[RowProvenance, ...]
    provenance: Mapping[str, RowProvenance] = field(default_factory=dict)
    """Values that are no row (inside a kernel the runtime fused): what PyTorch says of them."""
    rtol: float = 1e-3
    atol: float = 1e-5
    tolerance_basis: str | None = None
    given_rtol: float | None = None
    given_atol: float | None = None
    """The tolerance the user gave at the recording; ``None``: the candidate's precision's."""
    coverage: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    recorded: Mapping[str, Any] = field(default_factory=dict)
    """The recording's ``reference`` and ``candidate`` entries, its verdict and culprit."""
    onnx: Mapping[str, Any] = field(default_factory=dict)
    """Where the ONNX file is: ``{"member": "model.onnx"}`` or ``{"path": ...}``."""
    command: str | None = None
    """The command that records it again where PyTorch runs (from the command line)."""
    op_segments: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Op name -> the positions of its ONNX nodes in the graph: a local check of one
    op's nodes told from one of several where the nodes carry no metadata (TorchScript)."""
    reference_kind: str = PYTORCH
    """What the values are of: ``pytorch`` (a PyTorch model) or ``onnx`` (a reference
    ONNX file, ONNX against ONNX: nothing a check leaves out needs PyTorch)."""
    counterparts: tuple[str, ...] | None = None
    """The reference ONNX graph's node names (``onnx`` only): a candidate node that is
    none of them (a Cast a converter inserted) is told apart as the in-process run does."""
    converted: Mapping[str, Conversion] = field(default_factory=dict)
    """Values the run compared with their candidate value only once converted (``onnx``
    only, a QDQ candidate's): candidate value name -> how, and whose Q/DQ pair."""

    def to_json(self) -> JsonObject:
        """The manifest's JSON object, ``format`` and ``version`` first."""
        return {"format": FORMAT, "version": VERSION if self.converted else 1,
                "graph": self.graph.to_json(),
                "onnx": dict(self.onnx), "command": self.command,
                "tolerance": {"rtol": self.rtol, "atol": self.atol,
                              "basis": self.tolerance_basis, "given_rtol": self.given_rtol,
                              "given_atol": self.given_atol},
                "inputs": [entry.to_json() for entry in self.inputs],
                "values": [entry.to_json() for entry in self.values],
                "rows": [row.to_json() for row in self.rows],
                "final_outputs": [row.to_json() for row in self.final_outputs],
                "provenance": [row.to_json() for row in self.provenance.values()],
                "coverage": dict(self.coverage), "environment": dict(self.environment),
                "recorded": dict(self.recorded),
                "op_segments": {name: list(nodes) for name, nodes in self.op_segments.items()},
                "reference_kind": self.reference_kind,
                "counterparts": None if self.counterparts is None else list(self.counterparts),
                "converted": {name: {"how": conversion.how,
                                     "quantized_as": conversion.quantized_as}
                              for name, conversion in self.converted.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: Path) -> Manifest:
        """The manifest of the archive at ``path``, its header checked first.

        Raises:
            InputError: Another format or version, or a field this version does not hold.
        """
        check_header(data, path)
        try:
            tolerance = data["tolerance"]
            coverage = data["coverage"]
            Coverage.from_dict(coverage)  # readable as the report's coverage
            provenance = [RowProvenance.from_json(row) for row in data["provenance"]]
            return cls(
                graph=GraphDigest.from_json(data["graph"]),
                inputs=tuple(_entry(entry) for entry in data["inputs"]),
                values=tuple(_entry(entry) for entry in data["values"]),
                rows=tuple(RowProvenance.from_json(row) for row in data["rows"]),
                final_outputs=tuple(RowProvenance.from_json(row)
                                    for row in data["final_outputs"]),
                provenance={row.onnx_value: row for row in provenance},
                rtol=float(tolerance["rtol"]), atol=float(tolerance["atol"]),
                tolerance_basis=tolerance.get("basis"),
                given_rtol=_optional_float(tolerance.get("given_rtol")),
                given_atol=_optional_float(tolerance.get("given_atol")), coverage=dict(coverage),
                environment=dict(data["environment"]), recorded=dict(data["recorded"]),
                onnx=dict(data["onnx"]), command=data.get("command"),
                op_segments={str(name): tuple(int(index) for index in nodes)
                             for name, nodes in data["op_segments"].items()},
                reference_kind=_reference_kind(data.get("reference_kind", PYTORCH)),
                counterparts=_optional_names(data.get("counterparts")),
                converted={str(name): _conversion(conversion)
                           for name, conversion in data.get("converted", {}).items()})
        except KeyError as error:
            raise InputError(f"{path}: its manifest is malformed (no {error.args[0]!r} "
                             "field); record the reference again") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise InputError(f"{path}: its manifest is malformed ({type(error).__name__}: "
                             f"{error}); record the reference again") from None


def check_header(data: Mapping[str, Any], path: Path) -> None:
    """Refuse another format, or a version this bisect-onnx does not read."""
    if data.get("format") != FORMAT:
        raise InputError(f"{path} is not a bisect-onnx reference archive (its manifest's "
                         f"format is {data.get('format')!r}, not {FORMAT!r})")
    version = data.get("version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        newer = isinstance(version, int) and version > VERSION
        read = " and ".join(map(str, READ_VERSIONS))
        raise InputError(f"{path} is a reference archive of version {version!r}; this "
                         f"bisect-onnx reads versions {read}: "
                         + ("upgrade bisect-onnx where it is checked" if newer
                            else "record it again with this bisect-onnx"))


def _entry(data: Mapping[str, Any]) -> ArrayEntry:
    shape = tuple(int(dim) for dim in data["shape"])
    return ArrayEntry(str(data["name"]), str(data["member"]), str(data["dtype"]), shape)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _reference_kind(value: Any) -> str:
    if value not in (PYTORCH, ONNX):
        raise ValueError(f"reference_kind {value!r} is neither {PYTORCH!r} nor {ONNX!r}")
    return value


def _optional_names(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(str(name) for name in value)


def _conversion(data: Mapping[str, Any]) -> Conversion:
    if data["how"] not in _CONVERSIONS:
        raise ValueError(f"converted how {data['how']!r} is none of {sorted(_CONVERSIONS)}")
    return Conversion(str(data["how"]), str(data["quantized_as"]))
