"""The sweep's table says how many combinations passed: a skipped one is no pass."""

from __future__ import annotations

from bisect_onnx.judge.sweep_table import FAILED, PASSED, SKIPPED, SweepRow, SweepTable


def _table(*verdicts: str, bisected: int | None = None) -> SweepTable:
    rows = tuple(SweepRow(((size, 4),), "N(0,1)", 0.0 if verdict == PASSED else None, verdict)
                 for size, verdict in enumerate(verdicts, start=1))
    return SweepTable(("x",), ("x:0",), rows, bisected)


def test_every_combination_passing_is_said_so():
    assert _table(PASSED, PASSED, PASSED).passing_text() == (
        "all 3 combinations of the sweep pass")


def test_skipped_combinations_are_not_counted_as_passing():
    table = _table(PASSED, SKIPPED, SKIPPED)
    assert table.passing_text() == (
        "1 of 3 combinations of the sweep pass (2 skipped: PyTorch could not run them)")
    assert table.verdict_note().startswith("1 of 3 combinations")


def test_a_failing_combination_is_not_among_those_passing():
    assert _table(PASSED, FAILED, bisected=1).passing_text() == (
        "1 of 2 combinations of the sweep pass")
