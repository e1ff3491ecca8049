"""The PyTorch form's tolerance, made once: a base tolerance and the user's per-value rules.

Every row, final output, probe and local check of one run is judged through the same
object, so a rule from ``--tolerances`` applies everywhere its value appears and a
rule that matched nothing can be named afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.judge.compare import ArrayComparison, check_tolerances, compare_arrays
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record, make_record
from bisect_onnx.judge.tolerances import Tolerance, ToleranceRule, judged_by, rule_for
from bisect_onnx.judge.vocabulary import ReportWarning

if TYPE_CHECKING:
    from bisect_onnx.judge.reading import Reading
    from bisect_onnx.search.probes import Checkpoint

__all__ = ["ToleranceJudge", "UNUSED_RULE"]

UNUSED_RULE = ReportWarning("unused-tolerance-rule",
                            "tolerance rule {where} ({pattern}) matched no compared value")


@dataclass
class ToleranceJudge:
    """Judges a value by the first rule matching one of its names, else by ``base``.

    A value's names are its ONNX value name and, where known, the PyTorch op (FX node)
    or module call it stands for.
    """

    base: Tolerance
    rules: Sequence[ToleranceRule] = ()
    used: list[ToleranceRule] = field(default_factory=list)

    @classmethod
    def from_floats(cls, rtol: float, atol: float,
                    rules: Sequence[ToleranceRule] = ()) -> ToleranceJudge:
        """A judge for ``rtol`` and ``atol``, checked once here for every caller."""
        check_tolerances(rtol, atol)
        return cls(Tolerance(float(rtol), float(atol)), list(rules))

    def tolerance(self, *names: str | None) -> Tolerance:
        """The tolerance of the value known by ``names``."""
        rule = rule_for(self.rules, *(name for name in names if name))
        if rule is None:
            return self.base
        if rule not in self.used:
            self.used.append(rule)
        return rule.tolerance

    def compare(self, reference: np.ndarray, candidate: np.ndarray,
                *names: str | None) -> ArrayComparison:
        """Compare one value at its own tolerance."""
        tolerance = self.tolerance(*names)
        return compare_arrays(reference, candidate, rtol=tolerance.rtol, atol=tolerance.atol)

    def record(self, index: int, pair: Pair, *names: str | None,
               final: bool = False) -> Record:
        """The pair's row; its own rtol and atol are said where a rule set them."""
        names = (pair.candidate.name, *names)
        tolerance = self.tolerance(*names)
        record = make_record(index, pair, compare_arrays(
            pair.reference.array, pair.candidate.array, rtol=tolerance.rtol,
            atol=tolerance.atol), final=final)
        return self.mark(record, tolerance)

    def of(self, record: Record | None) -> Tolerance:
        """The tolerance ``record`` was judged by (its rule's, else the base)."""
        return judged_by(record, self.base)

    def mark(self, record: Record, tolerance: Tolerance) -> Record:
        """``record`` with the tolerance it was judged by, where that is not the base."""
        if tolerance == self.base:
            return record
        return replace(record, figures=replace(record.figures, rtol=tolerance.rtol,
                                               atol=tolerance.atol))

    def probe_comparer(self) -> Callable[[Checkpoint, np.ndarray], ArrayComparison]:
        """How a probed checkpoint is judged: at its own tolerance, as its row is."""
        def compare(checkpoint: Checkpoint, array: np.ndarray) -> ArrayComparison:
            return self.compare(checkpoint.reference.array, array, checkpoint.name,
                                checkpoint.reference.name)

        return compare

    def local_comparer(self, report: Reading, references: Mapping[str, np.ndarray],
                       ) -> Callable[[str, np.ndarray], ArrayComparison] | None:
        """A value rerun on the reference's inputs judged at its row's tolerance.

        ``None`` without rules: the local checks' own default is the base tolerance.
        """
        if not self.rules:
            return None
        names = {record.onnx_value: (record.fx_node, record.torch_module)
                 for record in report.comparisons}

        def compare(name: str, local: np.ndarray) -> ArrayComparison:
            return self.compare(references[name], local, name, *names.get(name, ()))

        return compare

    def unused_warnings(self) -> list[ReportWarning]:
        """One warning per rule that matched no value: a typo in a pattern, most often."""
        return [UNUSED_RULE.format(where=rule.where, pattern=rule.pattern)
                for rule in self.rules if rule not in self.used]
