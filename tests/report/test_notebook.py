"""The report in a notebook (``Report._repr_html_``) and its warnings as Python warnings."""

from __future__ import annotations

import dataclasses
import html
import warnings

import pytest

import bisect_onnx
from bisect_onnx.errors import issue_warnings
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Coverage, Record, Report
from bisect_onnx.judge.vocabulary import ReportWarning
from bisect_onnx.report.notebook import api_wording
from tests.made_reports import made_report, with_rows


@pytest.fixture(scope="module")
def diverged(fixture_case) -> Report:
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    return bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)


def record(index: int, status: str = "pass", module: str | None = None) -> Record:
    return Record(index=index, onnx_node=f"node_{index}", onnx_op="ReduceSum",
                  onnx_value=f"v{index}", torch_module=f"m{index}" if module is None else module,
                  torch_op=None, source=None, shape=[2], dtype="float32", candidate_shape=[2],
                  candidate_dtype="float32", figures=ComparisonFigures(
        max_abs_error=24.8 if status == "fail" else 1e-9, max_rel_error=1e-9, mismatch_fraction=0.0,
        min_passing_atol=1e-9, nan_mismatch=0, status=status))


def long_report(culprit_index: int, *, root: bool = False) -> Report:
    rows = [record(index, "fail" if index >= culprit_index else "pass",
                   module="" if root and index == culprit_index else None)
            for index in range(100)]
    return made_report(rows, [record(0, "fail")], first_divergence=rows[culprit_index],
                       culprit=rows[culprit_index], coverage=Coverage(100, 100, 100, 100))


def test_the_notebook_view_holds_the_verdict_the_culprit_and_its_source(diverged):
    view = diverged._repr_html_()
    headline, _, rest = diverged.summary().partition(":")
    assert f"<strong>{headline}</strong>" in view
    culprit = diverged.culprit or diverged.first_divergence
    assert culprit.onnx_node in view and "AveragePool" in view
    assert "fixtures/<wbr>models.<wbr>py:" in view  # the source line, wrapping at separators
    assert view.count('class="records sortable"') == 1
    assert "<script" not in view  # notebooks run no script of ours


def test_a_long_table_shows_a_window_around_the_culprit_with_the_apis_hint():
    view = long_report(culprit_index=60)._repr_html_()
    shown = [index for index in range(100) if f'id="bisect-onnx-row-{index}"' in view]
    assert shown == list(range(52, 69))
    assert view.count("rows hidden") == 2
    assert "… 52 rows hidden" in view and "… 31 rows hidden" in view
    assert html.escape('report.table(show="all")') in view
    assert "--show" not in view
    assert 'class="fail first-divergence culprit"' in view


def test_the_root_module_is_named_as_the_table_names_it():
    view = long_report(culprit_index=3, root=True)._repr_html_()
    assert "(model)" in view


def test_cli_options_in_report_sentences_read_as_api_arguments():
    assert api_wording("pass --max-memory 2GiB, or --show all") == (
        'pass RuntimeOptions(max_memory=...) 2GiB, or show="all"')
    assert (api_wording("attach the --repro-dir segment")
            == "attach the OutputOptions(repro_dir=...) segment")
    assert api_wording("no flag here") == "no flag here"


def test_escaping_covers_what_the_notebook_shows(diverged):
    evil = "<img src=x onerror=alert(1)>"
    first = dataclasses.replace(diverged.first_divergence, torch_module=evil)
    rows = [first if row is diverged.first_divergence else row for row in diverged.comparisons]
    report = with_rows(diverged, rows, warnings=[evil])
    view = report._repr_html_()
    assert evil not in view and html.escape(evil) in view


def test_report_warnings_are_python_warnings_at_the_users_call(fixture_case):
    model, inputs, exported = fixture_case("resnet_like")
    model.train()
    try:
        with pytest.warns(bisect_onnx.BisectOnnxWarning, match="training mode") as caught:
            report = bisect_onnx.bisect(model, inputs, onnx_model=exported)
    finally:
        model.eval()
    ours = [w for w in caught if issubclass(w.category, bisect_onnx.BisectOnnxWarning)]
    assert [str(w.message) for w in ours] == [str(text) for text in report.warnings]
    assert {w.filename for w in ours} == {__file__}  # the line that called bisect


def _call_from(module_name: str) -> list[warnings.WarningMessage]:
    """Warnings issued by ``issue_warnings`` called from code of ``module_name``."""
    code = compile("issue_warnings([ReportWarning('a-code', 'careful')])", "<caller>", "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(code, {"__name__": module_name, "issue_warnings": issue_warnings,
                    "ReportWarning": ReportWarning})
    return [w for w in caught if issubclass(w.category, bisect_onnx.BisectOnnxWarning)]


def test_a_warning_keeps_its_code_and_the_command_line_gets_none():
    (issued,) = _call_from("__main__")
    assert issued.message.code == "a-code" and str(issued.message) == "careful"
    assert issued.filename == "<caller>"
    # The CLI prints a report's warnings itself: no second copy through Python's warnings.
    assert _call_from("bisect_onnx.cli.command") == []
