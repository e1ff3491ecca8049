"""What a sweep's table says of itself: the combinations passing, those PyTorch skipped."""

from __future__ import annotations

from bisect_onnx.judge.sweep_table import PASSED, SKIPPED, SweepRow, SweepTable


def _table(*verdicts: str) -> SweepTable:
    rows = tuple(SweepRow(((size, 4),), "N(0,1)", None if verdict == SKIPPED else 0.0,
                          verdict, "shape '[2, 3]' is invalid" if verdict == SKIPPED else None)
                 for size, verdict in enumerate(verdicts, start=1))
    return SweepTable(("x",), ("batch",), rows, bisected=None)


def test_every_combination_passing_is_said_so():
    table = _table(PASSED, PASSED)
    assert table.passing_text() == "all 2 combinations of the sweep pass"
    assert table.verdict_note().startswith("the sweep's 2 combinations")


def test_combinations_pytorch_skipped_are_not_counted_as_passing():
    table = _table(PASSED, SKIPPED, SKIPPED)
    said = "1 of 3 combinations of the sweep pass, 2 skipped (PyTorch could not run them)"
    assert table.passing_text() == said
    assert table.verdict_note() == f"{said}; the report is the sample's"
    assert "all pass" not in table.verdict_note()
