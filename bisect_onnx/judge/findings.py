"""What each stage of a run finds, as frozen values: the assembler's only inputs.

A run's stages do not write into a report. Each returns its findings (the comparison,
production's search, the culprit's attribution, what was found inside the culprit's op,
the run's description), and :func:`bisect_onnx.judge.assembly.assemble` makes the
:class:`~bisect_onnx.judge.records.Report` from them, holding the verdict's invariants
in that one place. A stage that reads what an earlier one found reads an assembled
report; what it adds is findings again.

Records are referred to by ONNX value name (:class:`RowRef`), never copied: the
report looks its culprit and first divergence up among its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.judge.refs import COMPARISONS, FINAL_OUTPUTS, KERNEL_VALUES, RowRef
from bisect_onnx.judge.sweep_table import SweepTable
from bisect_onnx.judge.vocabulary import Verdict

if TYPE_CHECKING:
    from bisect_onnx.align.modules import Unaligned
    from bisect_onnx.fixes.trial import FixResult
    from bisect_onnx.judge.report_parts import CulpritNode
    from bisect_onnx.judge.verdict import Decision

__all__ = ["RowRef", "ComparisonFindings", "SearchFindings", "LocalFigures",
           "AttributionFindings", "Refinement", "RunDescription", "Findings",
           "COMPARISONS", "FINAL_OUTPUTS", "KERNEL_VALUES"]


@dataclass(frozen=True)
class ComparisonFindings:
    """Aligned values compared, and what their figures decide."""

    verdict: Verdict
    rtol: float
    atol: float
    final_outputs: tuple[Record, ...]
    comparisons: tuple[Record, ...]
    coverage: Coverage
    first_divergence: RowRef | None = None
    note: str | None = None
    nan_origin: RowRef | None = None
    unaligned: tuple[Unaligned, ...] = ()
    onnx_unaligned: tuple[Unaligned, ...] = ()
    op_comparisons: tuple[Record, ...] = ()
    warnings: tuple[str, ...] = ()
    tolerance_basis: str | None = None

    @classmethod
    def decided(cls, decision: Decision, *, rtol: float, atol: float, final_outputs: list[Record],
                comparisons: list[Record], coverage: Coverage, **fields: Any,
                ) -> ComparisonFindings:
        """The findings of ``decision`` (:func:`bisect_onnx.judge.verdict.decide`)."""
        first = decision.first_divergence
        in_outputs = first is not None and not any(row is first for row in comparisons)
        for name in ("unaligned", "onnx_unaligned", "op_comparisons", "warnings"):
            if name in fields:
                fields[name] = tuple(fields[name])
        return cls(verdict=decision.verdict, rtol=rtol, atol=atol,
                   final_outputs=tuple(final_outputs), comparisons=tuple(comparisons),
                   coverage=coverage,
                   first_divergence=RowRef.of(first, FINAL_OUTPUTS if in_outputs
                                              else COMPARISONS),
                   note=decision.note, nan_origin=RowRef.of(decision.nan_origin), **fields)


@dataclass(frozen=True)
class SearchFindings:
    """How production was searched, and the comparison as production's kernels show it."""

    search: Mapping[str, Any]
    """``mode`` (``full capture``, ``bisection``, ``final outputs only``), why, probes."""
    comparison: ComparisonFindings | None = None
    """The comparison with production's figures and first divergence; ``None``: the
    capture's stands."""


@dataclass(frozen=True)
class LocalFigures:
    """One failing value's local check: its nodes fed the reference's exact inputs."""

    introduced_here: bool | None
    """Out of tolerance even so (``None``: could not be checked)."""
    local_max_abs_error: float | None = None
    local_status: str | None = None
    local_nan_mismatch: int = 0
    local_exceeds: bool = False
    """The local figures exceed the value's own tolerance (max abs or NaN placement)."""
    error_growth: float | None = None
    classification: str | None = None
    compute_nodes: tuple[str, ...] = ()
    """The checked segment's nodes that compute data (not Constant or shape arithmetic)."""
    isolation: str | None = None
    """``node``: one compute node ran; ``op``: the nodes of one torch op ran (a Linear's
    MatMul and Add); ``None``: a segment of several ops."""


@dataclass(frozen=True)
class AttributionFindings:
    """Which failing values their own nodes introduce: the culprit and the evidence."""

    checked: Mapping[str, LocalFigures]
    """Every value checked locally, by ONNX value name."""
    culprits: tuple[RowRef, ...] = ()
    """Values that introduce error beyond rounding, in graph order; the first is the
    culprit (all of them only when every culprit was asked for)."""
    listed_all: bool = False
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """How the culprit was found, for the JSON report's ``attribution``."""
    kernel_values: tuple[Record, ...] = ()
    """Records a culprit names that are no table row: a value inside a fused kernel, or
    a PyTorch computation the ONNX graph has no node for."""
    kernel_checked: Mapping[str, LocalFigures] = field(default_factory=dict)
    """What shows each of ``kernel_values`` to introduce the error, by ONNX value."""
    segment: Mapping[str, Any] | None = None
    """Where the first failing value's check ran several ops and nothing inside could
    be shown to fail alone: the segment (``from``, ``to``, ``nodes``), named instead."""


@dataclass(frozen=True)
class Refinement:
    """What was found inside the culprit's op, and the names it gives its record."""

    inside_op: Mapping[str, Any] | None = None
    """Which node inside a multi-node op went wrong, and how that was found."""
    node: tuple[str, str] | None = None
    """``(ONNX node, op type)`` the culprit (else the first divergence) is narrowed to."""
    fx_nodes: Mapping[str, str] = field(default_factory=dict)
    """ONNX value -> the FX node whose value it is, for records that had none."""


@dataclass(frozen=True)
class RunDescription:
    """What was compared, how and where."""

    environment: Mapping[str, Any] = field(default_factory=dict)
    reference: Mapping[str, Any] = field(default_factory=dict)
    candidate: Mapping[str, Any] = field(default_factory=dict)
    capture: Mapping[str, Any] = field(default_factory=dict)
    culprit_node: CulpritNode | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Findings:
    """Everything one sample's stages found: a report is made from this alone."""

    comparison: ComparisonFindings
    search: SearchFindings | None = None
    attribution: AttributionFindings | None = None
    refinement: Refinement | None = None
    description: RunDescription | None = None
    warnings: tuple[str, ...] = ()
    """Said by the driver (subgraphs not compared, a foreign file), after the comparison's."""
    repro: Mapping[str, Any] | None = None
    repro_warnings: tuple[str, ...] = ()
    samples_note: str | None = None
    fixes: tuple[FixResult, ...] = ()
    """The fix stage's checked results."""
    fix_notes: tuple[str, ...] = ()
    """Why a fix search could not run, and what was tried, one line each."""
    """Which of several samples this is (the worst one's report says so)."""
    sweep: SweepTable | None = None
    """With a sweep: every combination of shapes and input scales tried before this one."""

    @property
    def judged(self) -> ComparisonFindings:
        """The comparison the verdict rests on: production's, where it was searched."""
        if self.search is not None and self.search.comparison is not None:
            return self.search.comparison
        return self.comparison
