"""Reading a report's rows by reference: its first divergence, culprit and NaN origin.

A :class:`~bisect_onnx.judge.records.Report` and the
:class:`~bisect_onnx.judge.reading.Reading` the stages read before it is made both
hold their rows in tables (``comparisons``, ``final_outputs``, ``kernel_values``) and
refer to the rows that matter by value name (:class:`~bisect_onnx.judge.refs.RowRef`):
this is how either finds them, so the two cannot name different rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.judge.vocabulary import Verdict

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bisect_onnx.judge.records import Record
    from bisect_onnx.judge.refs import RowRef

__all__ = ["RowReading"]


class RowReading:
    """The rows a verdict names, looked up among the tables (by subclasses' fields)."""

    verdict: Verdict
    comparisons: Sequence[Record]
    first_divergence_ref: RowRef | None
    culprit_ref: RowRef | None
    culprit_refs: tuple[RowRef, ...] | None
    nan_origin_ref: RowRef | None

    def _row(self, ref: RowRef | None) -> Record | None:
        """The record ``ref`` names."""
        return None if ref is None else ref.find(getattr(self, ref.table))

    @property
    def first_divergence(self) -> Record | None:
        """The first failing value (a final output when no intermediate fails)."""
        return self._row(self.first_divergence_ref)

    @property
    def culprit(self) -> Record | None:
        """The answer: the node that introduces the error (``None`` when none was shown).

        The first failing value whose own node, fed the reference's exact inputs, still
        fails beyond float rounding.
        """
        return self._row(self.culprit_ref)

    @property
    def culprits(self) -> list[Record] | None:
        """With ``all_culprits``: every value that introduces error, in graph order."""
        if self.culprit_refs is None:
            return None
        return [row for row in map(self._row, self.culprit_refs) if row is not None]

    @property
    def nan_origin(self) -> Record | None:
        """The first value with NaN or Inf on one side only, if it is not the first to fail.

        An earlier value may fail by a small margin: where the NaN starts matters more.
        """
        return self._row(self.nan_origin_ref)

    @property
    def hidden_divergences(self) -> list[Record]:
        """At parity: the intermediate values that fail (masked positions, say)."""
        if self.verdict == Verdict.DIVERGED:
            return []
        return [row for row in self.comparisons if row.failed]

    @property
    def diverged(self) -> bool:
        """Whether the final outputs disagree."""
        return self.verdict == Verdict.DIVERGED
