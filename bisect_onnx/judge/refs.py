"""How a report names one of its rows: by ONNX value and the list that holds it.

Apart from :mod:`bisect_onnx.judge.findings`, which the stages fill, because a report
read back from its JSON (:meth:`bisect_onnx.judge.records.Report.load`) names its rows
too, and the records module cannot import the findings (they are made of records).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: records name their rows with this module
    from bisect_onnx.judge.records import Record

__all__ = ["RowRef", "COMPARISONS", "FINAL_OUTPUTS", "KERNEL_VALUES"]

COMPARISONS = "comparisons"
FINAL_OUTPUTS = "final_outputs"
KERNEL_VALUES = "kernel_values"
"""Values inside a kernel ONNX Runtime fused, computed by the culprit's local check:
no row of the table, but a record the culprit may be."""


@dataclass(frozen=True)
class RowRef:
    """A record of the report, by its ONNX value and the list it is in.

    Several rows may hold one value (a module passing its input through): the first
    failing one is meant, else the first.
    """

    value: str
    table: str = COMPARISONS

    @classmethod
    def of(cls, record: Record | None, table: str = COMPARISONS) -> RowRef | None:
        """The reference to ``record`` (``None`` for none)."""
        return None if record is None else cls(record.onnx_value, table)

    def find(self, rows: Iterable[Record]) -> Record | None:
        """The record this names among ``rows`` (its list): the first failing, else the first."""
        held = [row for row in rows if row.onnx_value == self.value]
        return next((row for row in held if row.failed), held[0] if held else None)
