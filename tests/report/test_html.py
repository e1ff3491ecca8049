"""The HTML report, read back from real bisections and from hand-made records."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest

import bisect_onnx
from bisect_onnx.errors import InputError
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Record, Report
from bisect_onnx.report.html import render_html, write_html
from bisect_onnx.report.html_chart import marked_record
from tests.made_reports import made_report, with_rows


@pytest.fixture(scope="module")
def diverged(fixture_case) -> Report:
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    return bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)


@pytest.fixture(scope="module")
def parity(fixture_case) -> Report:
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    return bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)


def record(index: int, error: float | None, status: str = "pass") -> Record:
    return Record(index=index, onnx_node=f"node_{index}", onnx_op="Add", onnx_value=f"v{index}",
                  torch_module=f"m{index}", torch_op=None, source=None, shape=[2], dtype="float32",
                  candidate_shape=[2], candidate_dtype="float32", figures=ComparisonFigures(
        max_abs_error=error, max_rel_error=error, mismatch_fraction=0.0, min_passing_atol=error,
        nan_mismatch=0, status=status))


def test_diverged_report_shows_verdict_culprit_node_and_module(diverged):
    page = render_html(diverged)
    assert diverged.first_divergence.torch_module == "pool"
    headline, _, rest = diverged.summary().partition(":")
    assert f"<strong>{headline}</strong>{html.escape(':' + rest)}" in page
    culprit = page[page.index('id="culprit"'):page.index('id="comparisons-section"')]
    assert "culprit: node_avg_pool2d" in culprit
    assert "AveragePool" in culprit and "<code>pool</code>" in culprit
    assert "kernel_shape" in culprit and "[1,4,8,8]" in culprit
    assert "fixtures/<wbr>models.<wbr>py:" in culprit
    assert "classification" in culprit and "graph semantics" in culprit
    assert "introduced here" in culprit and "yes: fed PyTorch" in culprit


def test_one_table_row_per_comparison_and_output(diverged):
    page = render_html(diverged)
    rows = re.findall(r'<tr id="row-(\d+)"', page)
    assert rows == [str(record.index) for record in diverged.comparisons]
    assert len(re.findall(r'<tr id="output-\d+"', page)) == len(diverged.final_outputs)
    marked = re.findall(r'<tr id="row-(\d+)" class="fail first-divergence[ "]', page)
    assert marked == [str(diverged.first_divergence.index)]


def test_chart_has_a_point_per_comparison_and_marks_the_culprit(diverged):
    page = render_html(diverged)
    chart = page[page.index("<svg"):page.index("</svg>")]
    assert chart.count('class="point ') == len(diverged.comparisons)
    assert 'id="chart-culprit"' in chart
    assert diverged.culprit is diverged.first_divergence
    assert "culprit: pool" in chart
    assert "atol = 1e-05" in chart
    first = diverged.first_divergence.index
    assert f"<title>#{first} pool\nONNX node node_avg_pool2d (AveragePool)" in chart


def test_page_is_self_contained(diverged, parity):
    for report in (diverged, parity):
        page = render_html(report)
        assert "http://" not in page and "https://" not in page
        assert "<link" not in page and " src=" not in page
        assert page.count("<script>") == 1  # the page's own sort and filter script


def test_parity_report_has_no_culprit(parity):
    page = render_html(parity)
    assert "PARITY" in page
    assert "no culprit" in page
    assert 'id="chart-culprit"' not in page
    assert len(re.findall(r'<tr id="row-\d+"', page)) == len(parity.comparisons)


def test_every_string_from_the_records_is_escaped(diverged):
    evil = "<script>alert(1)</script>"
    first = dataclasses.replace(diverged.first_divergence, torch_module=evil)
    rows = [first if item is diverged.first_divergence else item for item in diverged.comparisons]
    report = with_rows(diverged, rows,
                       culprit_node=dataclasses.replace(diverged.culprit_node, torch_module=evil),
                       warnings=[evil])
    page = render_html(report)
    assert evil not in page
    assert page.count("<script>") == 1
    assert html.escape(evil) in page


def test_zero_and_missing_errors_stay_inside_the_plot():
    rows = [record(0, 0.0), record(1, 1e-6), record(2, None, "shape_mismatch")]
    report = made_report(rows, [record(0, 1.0, "fail")], first_divergence=rows[2])
    page = render_html(report)
    heights = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)" r="4"', page)]
    assert len(heights) == 3 and all(0 < y < 340 for y in heights)
    assert "exact zeros are drawn at 1e-07" in page
    assert "no finite figure" in page


def test_write_html_writes_the_page_and_reports_an_unwritable_path(diverged, tmp_path):
    target = tmp_path / "report.html"
    write_html(diverged, target)
    assert target.read_text(encoding="utf-8") == render_html(diverged)
    with pytest.raises(InputError, match="cannot write the HTML report") as error:
        write_html(diverged, tmp_path / "missing" / "report.html")
    assert "\n" not in str(error.value)


def _hand_made(rows: list[Record], **fields) -> Report:
    fields.pop("hidden_divergences", None)  # a report at parity finds them in its rows
    outputs = [record(0, 1.0, "pass" if fields.get("verdict") == "parity" else "fail")]
    return made_report(rows, outputs, **fields)


def test_a_culprit_in_the_root_module_is_named_as_the_table_names_it():
    rows = [record(0, 1e-9), dataclasses.replace(record(1, 0.5, "fail"), torch_module="")]
    page = render_html(_hand_made(rows, first_divergence=rows[1], culprit=rows[1]))
    title = page[page.index("<title>"):page.index("</title>")]
    assert title.endswith(" at (model)")
    assert "culprit: (model)" in page  # the chart's label
    assert "<td data-sort=\"(model)\" class=\"name\">(model)</td>" in page


def test_a_hidden_divergence_gets_the_mark_on_the_chart():
    rows = [record(0, 1e-9), record(1, 0.5, "fail"), record(2, 1e-9)]
    page = render_html(_hand_made(rows, verdict="parity", hidden_divergences=[rows[1]]))
    chart = page[page.index("<svg"):page.index("</svg>")]
    assert 'id="chart-culprit"' in chart and "hidden divergence: m1" in chart
    culprit_too = render_html(_hand_made(rows, verdict="parity", hidden_divergences=[rows[1]],
                                         culprit=rows[1]))
    assert "culprit: m1" in culprit_too


def test_a_culprit_inside_a_fused_kernel_is_marked_at_the_kernel_s_row_by_its_own_module():
    rows = [record(0, 1e-9), record(1, 0.5, "fail"), record(2, 0.7, "fail")]
    # The culprit computes v9 inside the kernel whose output is row 1 (the first divergence).
    inside = dataclasses.replace(record(1, 0.3, "fail"), onnx_value="v9", torch_module="bn")
    report = _hand_made(rows, first_divergence=rows[1], culprit=inside,
                        attribution={"inside_kernel": {"value": "v9", "node": "node_9",
                                                       "kernel_output": "v1"}})
    page = render_html(report)
    chart = page[page.index("<svg"):page.index("</svg>")]
    assert "culprit: bn" in chart and "first divergence: m1" not in chart
    assert marked_record(report) == ("culprit", rows[1], inside)


def test_the_table_fits_the_page_with_its_status_column_and_cards_wrap_long_values():
    rows = [dataclasses.replace(record(0, 24.8, "fail"),
                                torch_op="aten._native_batch_norm_legit_no_training.default")]
    page = render_html(_hand_made(rows, first_divergence=rows[0]))
    # A fixed layout sizes columns by the <col> widths, not by the longest name in them.
    assert "table.records { width: 100%; table-layout: fixed; }" in page
    table = page[page.index('<table id="comparisons"'):]
    cols = re.findall(r"<col(?: style=\"width: ([^\"]+)\")?>", table[:table.index("</colgroup>")])
    headers = re.findall(r"<th [^>]*>([^<]+)</th>", table[:table.index("</thead>")])
    assert len(cols) == len(headers) and headers[-1] == "status" and cols[-1]
    names = {"torch op", "torch module", "ONNX node"}
    assert all(bool(width) != (header in names)
               for width, header in zip(cols, headers, strict=True))
    assert "grid-template-columns: minmax(0, max-content) minmax(0, 1fr)" in page


def test_figures_and_op_names_never_wrap_and_long_names_wrap_at_separators():
    rows = [dataclasses.replace(record(0, 24.8, "fail"), onnx_op="ReduceSum",
                                torch_module="encoder.layer.1.attention.self.query")]
    page = render_html(_hand_made(rows, first_divergence=rows[0]))
    assert '<td data-sort="ReduceSum" class="fig">ReduceSum</td>' in page
    assert 'class="fig">2.48e+01</td>' in page
    assert "encoder.<wbr>layer.<wbr>1.<wbr>attention" in page
    assert "td.fig { white-space: nowrap; }" in page
    assert "overflow-wrap: anywhere" not in page  # it broke "2.48e+0 / 1" and "Reduce / Sum"
