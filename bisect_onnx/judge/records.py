"""The records every output format is made from.

One :class:`Record` per compared value pair; the table, the JSON file, the verdict
line and (later) HTML and the pytest plugin all format these and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from bisect_onnx.align.modules import Pair, Unaligned
from bisect_onnx.graph.provenance import SourceLocation
from bisect_onnx.judge.compare import ArrayComparison
from bisect_onnx.judge.record_parts import ComparisonFigures, LocalOutcome, MatchInfo
from bisect_onnx.judge.report_data import (
    SCHEMA_VERSION,
    attribution_data,
    culprit_data,
    report_fields,
)
from bisect_onnx.judge.report_parts import (
    Attribution,
    CaptureDescription,
    CulpritNode,
    CulpritSegment,
    Environment,
    InsideOp,
    ReproFolder,
    Search,
    SideDescription,
)
from bisect_onnx.judge.rows import RowReading
from bisect_onnx.judge.sweep_table import SweepTable
from bisect_onnx.judge.vocabulary import Granularity, Status, Verdict
from bisect_onnx.runtime.sides import JsonObject

if TYPE_CHECKING:  # types only: save and load's paths; findings are made of records
    import os
    from pathlib import Path

    from bisect_onnx.fixes.trial import FixResult
    from bisect_onnx.judge.findings import Findings, RowRef

__all__ = ["Record", "ComparisonFigures", "LocalOutcome", "MatchInfo", "Coverage", "Report",
           "make_record", "SCHEMA_VERSION"]


@dataclass(frozen=True)
class Record:
    """One compared pair: where the value came from on both sides, and its error figures."""

    index: int
    onnx_node: str | None
    onnx_op: str | None
    onnx_value: str
    torch_module: str | None
    """Module path; ``relu@1`` is the second call of ``relu``; ``None`` for final outputs."""
    torch_op: str | None
    source: SourceLocation | None
    shape: list[int]
    dtype: str
    candidate_shape: list[int]
    candidate_dtype: str
    figures: ComparisonFigures
    local: LocalOutcome = LocalOutcome()
    """The local check of a failing value (all ``None`` where it was not checked)."""
    fx_node: str | None = None
    """Op level: the FX node (torch op call) the compared torch value is the output of."""
    match: MatchInfo = MatchInfo()
    """How the two sides were matched (ONNX against ONNX, a file of unknown origin) and
    what the ops inside a module call showed."""

    @property
    def failed(self) -> bool:
        """Whether this pair is out of tolerance (or mismatched in shape, dtype or NaN)."""
        return self.figures.status != Status.PASS

    @property
    def identical(self) -> bool:
        """Whether both sides computed this value bit for bit alike.

        An integer chain, a masked value: no error before it reaches anything through it.
        """
        figures = self.figures
        return (figures.status == Status.PASS and figures.max_abs_error == 0
                and not figures.nan_mismatch and self.shape == self.candidate_shape)

    def to_dict(self) -> JsonObject:
        """The record as the JSON schema lays it out: flat, the parts' fields in order."""
        data = {item.name: getattr(self, item.name) for item in fields(self)
                if item.name not in (*_PARTS, "fx_node")}
        figures = asdict(self.figures)
        judged_by = {name: figures.pop(name) for name in ("sqnr_db", "rtol", "atol")}
        return {**data, "source": self.source.to_dict() if self.source else None,
                "shape": list(self.shape), "candidate_shape": list(self.candidate_shape),
                **figures, **self.local.to_dict(), "fx_node": self.fx_node,
                **asdict(self.match), **judged_by}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """The record :meth:`to_dict` gave, read back from JSON.

        A non-finite figure (``null`` in JSON) reads back as ``None``; keys that are not
        the record's (the culprit's ``node``) are ignored.
        """
        values = {item.name: data[item.name] for item in fields(cls) if item.name not in _PARTS}
        source = values["source"]
        return cls(**{**values, "source": SourceLocation.from_dict(source) if source else None},
                   figures=ComparisonFigures.from_dict(data), local=LocalOutcome.from_dict(data),
                   match=MatchInfo.from_dict(data))


#: The record's fields that hold parts (the JSON writes their fields flat, in the record).
_PARTS = ("figures", "local", "match")


def make_record(index: int, pair: Pair, result: ArrayComparison, *, final: bool = False) -> Record:
    """Build a record from an aligned pair and its comparison."""
    candidate = pair.candidate.provenance
    reference = pair.reference
    torch_module = None if final else reference.name
    fx_node = reference.provenance.fx_node
    if fx_node is not None and not final:  # an op: named by the module call around it
        torch_module = reference.provenance.scopes[-1] if reference.provenance.scopes else ""
    return Record(
        index=index,
        onnx_node=candidate.node,
        onnx_op=candidate.node_op,
        onnx_value=pair.candidate.name,
        torch_module=torch_module,
        torch_op=reference.provenance.torch_op if fx_node else candidate.torch_op,
        source=(reference.provenance.source or candidate.source) if fx_node
        else candidate.source,
        shape=list(result.shape),
        dtype=result.dtype,
        candidate_shape=list(result.candidate_shape),
        candidate_dtype=result.candidate_dtype,
        figures=ComparisonFigures(
            max_abs_error=result.max_abs_error,
            max_rel_error=result.max_rel_error,
            mismatch_fraction=result.mismatch_fraction,
            min_passing_atol=result.min_passing_atol,
            nan_mismatch=result.nan_mismatch,
            status=result.status,
        ),
        fx_node=fx_node,
    )


@dataclass(frozen=True)
class Coverage:
    """How much of each side the alignment could pair up."""

    onnx_values: int
    aligned_values: int
    torch_modules: int
    """Module calls recorded on the PyTorch side (each call of a reused module counts)."""
    aligned_modules: int
    onnx_nodes: int = 0
    attributed_nodes: int = 0
    """ONNX nodes the exporter's metadata or node names attribute to a module (or the model)."""
    inferred_nodes: int = 0
    """Op level: attributed nodes that carry no metadata, attributed through the FX name
    their outputs were named after (nodes the exporter's optimizer rebuilt)."""
    granularity: Granularity = Granularity.MODULE
    """``op`` (rows are ATen ops) or ``module`` (rows are module calls)."""
    torch_ops: int = 0
    """Op level: ops whose value torch computed as one tensor."""
    compared_ops: int = 0
    fused_ops: int = 0
    """Op level: ops fused by the exporter's optimizer into another op's ONNX node."""
    fx_named_values: int = 0
    """Op level: floating-point ONNX values that stand for an op's value (named after it
    or mapped to it through metadata); decomposition intermediates are not among them."""
    fx_named_compared: int = 0
    op_scope: str | None = None
    """Op level for one module call only (``layer3.4``, traced alone for a file exported
    elsewhere): the ops counted are that call's, the other rows module calls."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Coverage:
        """The coverage as the JSON report writes it, read back."""
        return cls(**{**data, "granularity": Granularity(data["granularity"])})


@dataclass(frozen=True)
class Report(RowReading):
    """The result of one bisection: verdict, records and context.

    Made only by :func:`bisect_onnx.judge.assembly.assemble`, from the stages' findings
    (``findings``), or read back by :meth:`load` from the JSON of a report made so. The
    culprit, the first divergence and the NaN origin are looked up by value name among
    the report's own rows, so they cannot disagree with them.
    """

    verdict: Verdict
    """``parity`` or ``diverged``, decided by the final outputs."""
    rtol: float
    atol: float
    environment: Environment
    reference: SideDescription
    candidate: SideDescription
    final_outputs: list[Record]
    comparisons: list[Record]
    coverage: Coverage
    unaligned: list[Unaligned] = field(default_factory=list)
    """Torch values (module outputs, or ops at op level) with no ONNX value, and why."""
    onnx_unaligned: list[Unaligned] = field(default_factory=list)
    """Op level: ONNX values with no torch value (decomposition intermediates), and why."""
    op_comparisons: list[Record] = field(default_factory=list)
    """Module granularity with op data: the op rows the module rows aggregate."""
    warnings: list[str] = field(default_factory=list)
    note: str | None = None
    """Extra context for the verdict (where the culprit must lie when no checkpoint fails)."""
    repro: ReproFolder | None = None
    """Where the minimal repro of the first divergence was written, if asked for."""
    attribution: Attribution | None = None
    """How the culprit was found: values checked, inputs fed, classification, drift."""
    capture: CaptureDescription = field(default_factory=CaptureDescription)
    """How the candidate's values were captured, and checked against production."""
    inside_op: InsideOp | None = None
    """Op level: which node inside the first divergence's multi-node op went wrong."""
    culprit_node: CulpritNode | None = None
    """The culprit's ONNX node in its graph (else the first divergence's)."""
    tolerance_basis: str | None = None
    """Where the tolerance comes from when not the float32 default (a precision, a file)."""
    search: Search = field(default_factory=Search)
    kernel_values: list[Record] = field(default_factory=list)
    """Records a culprit names that are no table row: a value inside a kernel ONNX
    Runtime fused, a PyTorch computation with no ONNX node, an inserted node's value."""
    culprit_segment: CulpritSegment | None = None
    """Where only a segment of several nodes, no single node, was shown to introduce it."""
    fixes: tuple[FixResult, ...] = ()
    """With ``suggest_fix``: each candidate fix tried on a copy and checked by a rerun."""
    fix_notes: tuple[str, ...] = ()
    """Why a fix search could not run, or what was tried, one line each."""
    sweep: SweepTable | None = None
    """With ``sweep``: each combination of shapes and input scales tried, in order, and
    which one this report bisected (:class:`~bisect_onnx.judge.sweep_table.SweepTable`)."""
    first_divergence_ref: RowRef | None = field(default=None, repr=False)
    culprit_ref: RowRef | None = field(default=None, repr=False)
    culprit_refs: tuple[RowRef, ...] | None = field(default=None, repr=False)
    nan_origin_ref: RowRef | None = field(default=None, repr=False)
    findings: Findings | None = field(default=None, repr=False, compare=False)
    """The stages' findings this report was assembled from."""

    @property
    def hidden_divergences(self) -> list[Record]:
        """At parity: the intermediate values that fail, where some node introduces it.

        Where every one was rerun on PyTorch's inputs and none is off beyond float
        rounding (:attr:`rounding_buildup`), nothing is hidden: a deep network's rounding
        builds up past an element-wise tolerance near zero (a clean ResNet-50).
        """
        return [] if self.rounding_buildup else RowReading.hidden_divergences.fget(self)

    @property
    def rounding_buildup(self) -> list[Record]:
        """At parity: the failing intermediates, where none is off beyond float rounding.

        Each was rerun on PyTorch's inputs (the culprit search's drift): none
        introduces an error of its own; ``[]`` where one does, or they were not all rerun.
        """
        failing = RowReading.hidden_divergences.fget(self)
        drift = self.attribution is not None and self.attribution.drift
        return failing if failing and drift and self.culprit is None else []

    def to_dict(self) -> JsonObject:
        """The report as JSON data (schema :data:`SCHEMA_VERSION`)."""
        return {
            "schema": SCHEMA_VERSION,
            "verdict": self.verdict,
            "rtol": self.rtol,
            "atol": self.atol,
            "environment": self.environment,
            "reference": self.reference,
            "candidate": self.candidate,
            "culprit": culprit_data(self),
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "final_outputs": [record.to_dict() for record in self.final_outputs],
            "comparisons": [record.to_dict() for record in self.comparisons],
            "hidden_divergences": [record.to_dict() for record in self.hidden_divergences],
            "rounding_buildup": [record.onnx_value for record in self.rounding_buildup],
            "warnings": list(self.warnings),
            "coverage": asdict(self.coverage),
            "unaligned": [asdict(item) for item in self.unaligned],
            "onnx_unaligned": [asdict(item) for item in self.onnx_unaligned],
            "op_comparisons": [record.to_dict() for record in self.op_comparisons],
            "note": self.note,
            "attribution": attribution_data(self),
            "culprits": ([record.to_dict() for record in self.culprits]
                         if self.culprits is not None else None),
            "nan_origin": self.nan_origin.to_dict() if self.nan_origin else None,
            "capture": self.capture,
            "repro": self.repro.to_dict() if self.repro else None,
            "tolerance_basis": self.tolerance_basis,
            "search": self.search.to_dict(),
            "fixes": [fix.as_dict() for fix in self.fixes],
            "fix_notes": list(self.fix_notes),
            "sweep": self.sweep.to_dict() if self.sweep is not None else None,
            "culprit_segment": (self.culprit_segment.to_dict() if self.culprit_segment
                                else None),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """The report :meth:`to_dict` gave, read back from JSON (errors as :meth:`load`'s)."""
        return cls(**report_fields(data, record=Record.from_dict, coverage=Coverage.from_dict))

    def save(self, path: str | os.PathLike[str], format: str | None = None) -> Path:
        """Write the report to ``path`` (returned) as JSON, HTML or Model Explorer data.

        ``format`` is ``"json"``, ``"html"`` or ``"model-explorer"``; without it the
        suffix decides (``.json``; ``.html`` or ``.htm``). The path is checked and its
        errors said as for the CLI's ``--json``, ``--html`` and ``--model-explorer``.

        Raises:
            UsageError: No format is known for ``path``, or it is a compared model file.
            InputError: ``path`` cannot be written.
        """
        from bisect_onnx.report.saving import save_report

        return save_report(self, path, format)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """A JSON report bisect-onnx wrote, read back: ``Report.load(r.save(p)) == r``.

        What JSON cannot hold reads back as docs/json-schema.md says (a non-finite
        figure as ``None``, a warning as its text).

        Raises:
            InputError: ``path`` is missing, not JSON, not a bisect-onnx report, or a
                report of another schema version.
        """
        from bisect_onnx.report.saving import load_report

        return load_report(path, cls.from_dict)

    def summary(self) -> str:
        """The verdict in one line."""
        from bisect_onnx.report.verdict import verdict_line

        return verdict_line(self)

    def table(self, *, show: str = "window") -> str:
        """The comparison table (``show="all"`` for every row)."""
        from bisect_onnx.report.text import format_table

        return format_table(self, show=show)

    def _repr_html_(self) -> str:
        """The report in a notebook: verdict, culprit and the rows around it."""
        from bisect_onnx.report.notebook import notebook_html

        return notebook_html(self)

    def __str__(self) -> str:
        from bisect_onnx.report.fixes_text import fixes_section
        from bisect_onnx.report.sweep_text import sweep_section

        fixes, sweep = fixes_section(self), sweep_section(self)
        return (f"{self.table()}\n\n" + (f"{sweep}\n\n" if sweep else "") + self.summary()
                + (f"\n\n{fixes}" if fixes else ""))
