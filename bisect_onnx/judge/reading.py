"""What a sample's findings claim, checked: the :class:`Reading` stages and the report read.

A :class:`Reading` of a sample's :class:`~bisect_onnx.judge.findings.Findings` is what
the later stages read of the earlier ones' (its rows, first divergence, culprit), and
what :func:`~bisect_onnx.judge.assembly.assemble` lays the report out of. It holds the
claims a verdict makes to the evidence the run checked:

- a value named as the culprit was isolated: its local check ran its one node (or
  the nodes of its one torch op) alone on the reference's values, and that local
  result is out of the value's own tolerance;
- where only a segment of several ops could be checked, the report names the segment
  (``culprit_segment``), never its last node;
- the culprit, the first divergence, the NaN origin and the coverage agree with the
  rows the report holds, and the verdict with the final outputs.

A claim that breaks one of these is a bug in the stage that made it. The test suite
runs with :data:`STRICT_ENV` set, where it raises :class:`InvariantError`; in a user's
run the claim is weakened (the culprit not named, the coverage counted from the rows)
and a warning with a code says why. A wrong claim is never printed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from bisect_onnx.judge.findings import (
    COMPARISONS,
    FINAL_OUTPUTS,
    KERNEL_VALUES,
    AttributionFindings,
    Findings,
    LocalFigures,
    Refinement,
    RowRef,
    SearchFindings,
)
from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.judge.report_parts import Attribution, CulpritNode, InsideOp, Search
from bisect_onnx.judge.rows import RowReading
from bisect_onnx.judge.vocabulary import Granularity, ReportWarning, Verdict
from bisect_onnx.pytorch.calls import input_of

__all__ = ["Reading", "Claims", "checked_claims", "InvariantError", "STRICT_ENV",
           "CULPRIT_NOT_SHOWN", "ROWS_DISAGREE"]

logger = logging.getLogger(__name__)

#: Set to ``1`` (the test suite does) to make a broken invariant an error, not a warning.
STRICT_ENV = "BISECT_ONNX_STRICT"

CULPRIT_NOT_SHOWN = ReportWarning(
    "culprit-not-shown",
    "value {value!r} was put forward as the culprit, but {why}: no culprit is named for it")
ROWS_DISAGREE = ReportWarning(
    "rows-disagree",
    "{what} did not agree with the report's rows ({why}): {done}")


class InvariantError(AssertionError):
    """A verdict's claim that its own evidence contradicts (raised in strict runs only)."""


class Reading(RowReading):
    """A sample's findings as its report will read: what later stages read of them.

    The rows with their local figures, the culprit whose claim the evidence holds, the
    first divergence, the checked coverage: each worked out once, when first read, by
    the rules the report is made by. A stage reads this, never a report made for it;
    :func:`~bisect_onnx.judge.assembly.assemble` lays the report out of the last stage's
    reading, once.
    """

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    @cached_property
    def claims(self) -> Claims:
        """The checked claims (:func:`checked_claims`), worked out on first read."""
        return checked_claims(self.findings)

    @property
    def verdict(self) -> Verdict:  # type: ignore[override]
        """``parity`` or ``diverged``: the final outputs'."""
        return self.findings.judged.verdict

    @property
    def comparisons(self) -> list[Record]:  # type: ignore[override]
        """The compared values' rows, each with its local figures where it was checked."""
        return self.claims.tables[COMPARISONS]

    @property
    def final_outputs(self) -> list[Record]:
        """Production's final outputs judged."""
        return self.claims.tables[FINAL_OUTPUTS]

    @property
    def kernel_values(self) -> list[Record]:
        """Records a culprit names that are no table row."""
        return self.claims.tables[KERNEL_VALUES]

    @property
    def first_divergence_ref(self) -> RowRef | None:  # type: ignore[override]
        """The first failing value's row, by name."""
        return self.findings.judged.first_divergence

    @property
    def culprit_ref(self) -> RowRef | None:  # type: ignore[override]
        """The culprit's row: the first culprit the evidence holds, unless a segment is named."""
        claims = self.claims
        if not claims.culprits or (claims.attribution is not None
                                   and claims.attribution.segment is not None):
            return None
        return claims.culprits[0]

    @property
    def culprit_refs(self) -> tuple[RowRef, ...] | None:  # type: ignore[override]
        """Every culprit the evidence holds, where all were looked for."""
        attribution = self.claims.attribution
        return (tuple(self.claims.culprits) if attribution is not None
                and attribution.listed_all else None)

    @property
    def nan_origin_ref(self) -> RowRef | None:  # type: ignore[override]
        """Where NaN or Inf first appears on one side only."""
        return self.findings.judged.nan_origin

    @property
    def coverage(self) -> Coverage:
        """What was compared, counted from the rows."""
        return self.claims.coverage

    @property
    def search(self) -> Search:
        """How production was searched (``mode``, why, probes)."""
        search = self.findings.search
        return Search.from_dict(search.search) if search else Search()

    @property
    def attribution(self) -> Attribution | None:
        """How the culprit was found, naming only the culprits the evidence holds."""
        return _evidence(self.claims.attribution, self.claims.culprits)

    @property
    def culprit_node(self) -> CulpritNode | None:
        """The culprit's ONNX node in its graph, where the run was described."""
        description = self.findings.description
        return description.culprit_node if description is not None else None

    @property
    def inside_op(self) -> InsideOp | None:
        """The node found inside the culprit's op, and how."""
        refinement = self.findings.refinement
        return (InsideOp.from_dict(refinement.inside_op)
                if refinement and refinement.inside_op else None)


@dataclass(frozen=True)
class Claims:
    """The findings' rows and claims, checked: what a reading and the report show."""

    tables: dict[str, list[Record]]
    attribution: AttributionFindings | None
    """The attribution, a segment the refinement isolated turned into its culprit."""
    culprits: list[RowRef]
    """The culprits whose claim the evidence holds."""
    coverage: Coverage
    said: list[ReportWarning]


def checked_claims(findings: Findings) -> Claims:
    """The findings' claims checked.

    The rows with their local figures, the culprit's claim checked, the narrowing
    applied, the coverage checked.
    """
    comparison = findings.judged
    attribution = findings.attribution
    checked = attribution.checked if attribution is not None else {}
    rows = [_with_local(row, checked[row.onnx_value]) if row.onnx_value in checked else row
            for row in comparison.comparisons]
    kernel_values = list(attribution.kernel_values) if attribution is not None else []
    tables = {COMPARISONS: rows, FINAL_OUTPUTS: list(comparison.final_outputs),
              KERNEL_VALUES: kernel_values}
    said: list[ReportWarning] = []
    refinement = findings.refinement
    narrowed = _narrowed_in(attribution, refinement)
    if narrowed == "segment":
        # The node inside the segment that differs from the op's own translation, fed
        # the same exact inputs, with every node before it agreeing: it is isolated.
        attribution = replace(attribution, segment=None, culprits=(
            RowRef(attribution.segment["to"]), *attribution.culprits))
    culprit_refs = _shown_culprits(attribution, tables, said, narrowed is not None)
    first = comparison.first_divergence
    _check_first_divergence(comparison.verdict, first, tables, comparison.final_outputs)
    if refinement is not None:
        _refine(tables, refinement, culprit_refs[0] if culprit_refs else None, first)
    coverage = _checked_coverage(comparison.coverage, tables[COMPARISONS],
                                 findings.search, said)
    return Claims(tables, attribution, culprit_refs, coverage, said)


#: Ops that only move data: where a segment's nodes outside the op found wrong inside it
#: are all of these, the op's inputs are its segment's inputs, rearranged.
_DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                            "Expand", "Identity", "Slice", "Split", "Concat", "Gather"})


def _narrowed_in(attribution: AttributionFindings | None,
                 refinement: Refinement | None) -> str | None:
    """What the refinement's node isolates: ``culprit``, ``segment`` or ``None``.

    ``culprit``: the first culprit's checked nodes hold it; ``segment``: the segment
    named instead of a culprit holds it. A node found inside an op stands for the
    segment only where the segment's other nodes only move data, or were rerun on the
    reference's values and agreed (``passed_alone``): another compute node of it could
    have introduced the error (or fed the op wrong inputs).
    """
    if attribution is None or refinement is None or refinement.node is None:
        return None
    node = refinement.node[0]
    segment = attribution.segment
    if segment is not None:
        inside = set((refinement.inside_op or {}).get("nodes") or ())
        passed = set(attribution.evidence.get("passed_alone") or ())
        if node in passed:
            return None  # the node agreed when rerun alone: the evidence disagrees
        outside = [name for name in segment["nodes"] if name not in inside | passed]
        ops = segment.get("ops") or {}
        if (node in segment["nodes"] and segment["to"] in attribution.checked
                and all(ops.get(name) in _DATA_MOVEMENT for name in outside)):
            return "segment"
        return None
    if attribution.culprits:
        figures = attribution.checked.get(attribution.culprits[0].value)
        if figures is not None and (node in figures.compute_nodes or not figures.compute_nodes):
            return "culprit"
    return None


def _strict() -> bool:
    return os.environ.get(STRICT_ENV) == "1"


def _broken(message: str) -> None:
    """A broken invariant: an error in strict runs, a log line otherwise."""
    if _strict():
        raise InvariantError(message)
    logger.warning("report invariant: %s", message)


def _with_local(row: Record, figures: LocalFigures) -> Record:
    return replace(row, local=replace(row.local, introduced_here=figures.introduced_here,
                                      max_abs_error=figures.local_max_abs_error,
                                      status=figures.local_status,
                                      nan_mismatch=figures.local_nan_mismatch,
                                      error_growth=figures.error_growth,
                                      classification=figures.classification))


def _find(tables: dict[str, list[Record]], ref: RowRef) -> Record | None:
    return ref.find(tables.get(ref.table, ()))


def _shown_culprits(attribution: AttributionFindings | None, tables: dict[str, list[Record]],
                    said: list[ReportWarning], narrowed_to_node: bool) -> list[RowRef]:
    """The culprits whose claim the evidence holds; the others dropped, and said why."""
    if attribution is None:
        return []
    shown = []
    for number, ref in enumerate(attribution.culprits):
        figures = (attribution.kernel_checked if ref.table == KERNEL_VALUES
                   else attribution.checked).get(ref.value)
        why = _unshown(ref, figures, _find(tables, ref),
                       narrowed_to_node=narrowed_to_node and number == 0)
        if why is None:
            shown.append(ref)
            continue
        _broken(f"culprit {ref.value!r}: {why}")
        said.append(CULPRIT_NOT_SHOWN.format(value=ref.value, why=why))
    return shown


def _unshown(ref: RowRef, figures: LocalFigures | None, row: Record | None, *,
             narrowed_to_node: bool) -> str | None:
    """Why the evidence does not hold ``ref`` as a culprit; ``None`` when it does."""
    if row is None:
        return "the report holds no row of it"
    if figures is None or not figures.introduced_here:
        return "its local check did not fail"
    if not figures.local_exceeds:
        return "its local error is within its tolerance"
    if figures.isolation is None and not narrowed_to_node:
        return (f"its local check ran {len(figures.compute_nodes)} nodes of several ops, "
                "not the value's node alone")
    return None


def _check_first_divergence(verdict: str, first: RowRef | None,
                            tables: dict[str, list[Record]],
                            final_outputs: Sequence[Record]) -> None:
    """The verdict is the final outputs', and a divergence's first value fails."""
    if (verdict == Verdict.DIVERGED) != any(record.failed for record in final_outputs):
        _broken(f"verdict {verdict} disagrees with the final outputs")
    if verdict == Verdict.DIVERGED:
        row = _find(tables, first) if first is not None else None
        if row is None or not row.failed:
            _broken(f"the first divergence {first} is no failing row")
    elif first is not None:
        _broken("a report at parity names a first divergence")


def _refine(tables: dict[str, list[Record]], refinement: Refinement, culprit: RowRef | None,
            first: RowRef | None) -> None:
    """The node found inside the culprit's op (else the first divergence's), and op names."""
    targets = [ref for ref in (culprit, first) if ref is not None]
    if refinement.node is not None and targets:
        _rename(tables, targets[0], onnx_node=refinement.node[0], onnx_op=refinement.node[1])
    for ref in targets:
        fx_node = refinement.fx_nodes.get(ref.value)
        row = _find(tables, ref)
        if fx_node is not None and row is not None and row.fx_node is None:
            _rename(tables, ref, fx_node=fx_node)


def _rename(tables: dict[str, list[Record]], ref: RowRef, **fields: Any) -> None:
    """Give the record ``ref`` names, in every list that holds it."""
    row = _find(tables, ref)
    if row is None:
        return
    renamed = replace(row, **fields)
    for rows in tables.values():
        for index, item in enumerate(rows):
            if item is row:
                rows[index] = renamed


def _checked_coverage(coverage: Coverage, rows: Sequence[Record],
                      search: SearchFindings | None, said: list[ReportWarning]) -> Coverage:
    """The coverage, as the rows count it: what the table holds is what was compared."""
    if search is not None and search.search.get("mode") == "final outputs only":
        return coverage  # nothing was fetched: there are no rows to count
    intermediate = [row for row in rows if row.torch_module is not None]
    if coverage.op_scope is not None or coverage.granularity == Granularity.VALUE:
        return coverage
    if coverage.granularity == Granularity.OP:
        held = len({row.fx_node for row in intermediate if row.fx_node})
        if held != coverage.compared_ops and intermediate:
            _broken(f"coverage counts {coverage.compared_ops} ops compared, rows hold {held}")
            said.append(ROWS_DISAGREE.format(what="the coverage", why=(
                f"{coverage.compared_ops} ops counted, {held} in the rows"),
                done="it counts the rows"))
            return replace(coverage, compared_ops=held)
        return coverage
    held = len({_call_of(row.torch_module) for row in intermediate})
    if held != coverage.aligned_modules and intermediate:
        _broken(f"coverage counts {coverage.aligned_modules} module calls compared, "
                f"rows hold {held}")
        said.append(ROWS_DISAGREE.format(what="the coverage", why=(
            f"{coverage.aligned_modules} module calls counted, {held} in the rows"),
            done="it counts the rows"))
        return replace(coverage, aligned_modules=held)
    return coverage


def _call_of(name: str) -> str:
    """The module call a module row's value belongs to: ``fc`` for ``fc (input)``."""
    entering = input_of(name)
    return entering[0] if entering else _OUTPUT_INDEX.sub("", name)


#: An output's place in a call's tuple or dict output (``attn[0]``, ``out[logits]``).
_OUTPUT_INDEX = re.compile(r"(\[[^\]]*\])+$")


def _evidence(attribution: AttributionFindings | None,
              culprits: Sequence[RowRef]) -> Attribution | None:
    """How the culprit was found, naming only the culprits the evidence holds."""
    if attribution is None:
        return None
    return Attribution.from_dict(attribution.evidence,
                                 culprits[0].value if culprits else None)
