"""The terminal table and verdict line, from hand-made records."""

from __future__ import annotations

import re

from bisect_onnx.graph.provenance import SourceLocation
from bisect_onnx.judge.assembly import amended
from bisect_onnx.judge.findings import SearchFindings
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Coverage, Record, Report
from bisect_onnx.judge.verdict import decide
from tests.made_reports import made_report


def record(index: int, status: str = "pass", module: str | None = "m") -> Record:
    return Record(index=index, onnx_node=f"node_{index}", onnx_op="Add", onnx_value=f"v{index}",
                  torch_module=f"{module}{index}" if module else None, torch_op="aten.add.Tensor",
                  source=SourceLocation("model.py", 10 + index), shape=[2], dtype="float32",
                  candidate_shape=[2], candidate_dtype="float32", figures=ComparisonFigures(
        max_abs_error=0.5 if status != "pass" else 0.0, max_rel_error=0.1, mismatch_fraction=0.5,
        min_passing_atol=0.5, nan_mismatch=0, status=status))


def report(rows: list[Record], outputs: list[Record]) -> Report:
    decision = decide(rows, outputs)
    calls = len({row.torch_module for row in rows})  # each row its own module call
    return made_report(rows, outputs, verdict=decision.verdict,
                       first_divergence=decision.first_divergence, note=decision.note,
                       coverage=Coverage(onnx_values=max(10, calls), aligned_values=calls,
                                         torch_modules=max(10, calls), aligned_modules=calls))


def test_long_table_shows_a_window_around_the_first_divergence():
    rows = [record(i, "fail" if i >= 60 else "pass") for i in range(100)]
    result = report(rows, [record(0, "fail", module=None)])
    table = result.table()
    shown = {int(number) for number in re.findall(r"\bm(\d+)\b", table)}
    assert {52, 60, 68} <= shown
    assert 5 not in shown and 99 not in shown
    assert "rows hidden; --show all" in table
    marked = [line for line in table.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "m60" in marked[0]
    assert "m99" in result.table(show="all") and "m5 " in result.table(show="all")


def test_short_table_shows_every_row():
    rows = [record(i) for i in range(10)]
    table = report(rows, [record(0, module=None)]).table()
    assert all(f"m{i} " in table for i in range(10))
    assert "hidden" not in table


def test_verdict_line_names_node_module_op_and_source():
    rows = [record(0), record(1, "fail")]
    line = report(rows, [record(0, "fail", module=None)]).summary()
    assert line.startswith("DIVERGED")
    assert "'node_1'" in line and "m1" in line and "aten.add.Tensor" in line
    assert "model.py:11" in line


def test_zero_coverage_is_never_a_clean_bill():
    line = report([], [record(0, module=None)]).summary()
    assert "FINAL OUTPUTS ONLY" in line and "nothing inside the model was checked" in line


def test_hidden_divergences_are_counted_in_the_parity_line():
    rows = [record(0), record(1, "fail")]
    result = report(rows, [record(0, module=None)])
    assert result.verdict == "parity"
    assert "1 hidden intermediate divergence" in result.summary()


def test_advised_atol_is_rounded_up_so_it_passes():
    from bisect_onnx.report.formatting import format_rounded_up

    for value in (2.8590590465068816e-01, 1.0001e-5, 9.999e-3, 1.0e-3):
        assert float(format_rounded_up(value)) >= value
    assert format_rounded_up(2.8590590465068816e-01) == "2.86e-01"
    assert format_rounded_up(1.0e-3) == "1.00e-03"


_PROBE = {"values": ["v0"], "results": {"v0": "pass"}, "graph": "identical to production's"}


def test_the_verdict_says_how_bisection_found_it_or_that_no_checkpoint_failed():
    rows = [record(0), record(1, "fail")]
    plain = report(rows, [record(0, "fail", module=None)])
    search = {"mode": "bisection", "reason": "the budget", "checkpoints": 9,
              "probes": [_PROBE] * 3, "first_failing": "v1", "last_passing": "v0"}

    def searched(**changes):
        return amended(plain, search=SearchFindings({**search, **changes}))

    assert ("Found by bisection (3 probe(s) of the production graph over 9 checkpoints: "
            "first failing value 'v1', after 'v0', which passes) because the budget"
            in searched().summary())
    line = searched(first_failing=None).summary()
    assert "every checkpoint compared passes, the last 'v0': only the final outputs" in line
    assert "which passes" not in line
    assert "no checkpoint could be compared" in searched(
        first_failing=None, last_passing=None).summary()
    assert "bisection" not in amended(plain, search=SearchFindings(
        {"mode": "full capture"})).summary()


def test_a_row_of_the_models_own_forward_is_named_so_not_an_empty_module():
    """A recorded ONNX reference's value without a module scope: no "torch module :"."""
    from dataclasses import replace

    from bisect_onnx.report.verdict import describe_origin

    row = replace(record(0), torch_op=None, source=None)
    assert describe_origin(replace(row, torch_module="")) == "the model's own forward"
    assert describe_origin(replace(row, torch_module="fc")) == "torch module fc"
    assert describe_origin(replace(row, torch_module=None)) == "a final output"
