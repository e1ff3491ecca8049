"""The self-contained HTML report: verdict, figures, error chart, tables, the culprit.

One file with inline CSS, an inline SVG chart and a little vanilla JavaScript, so it opens
with no network. Every figure comes from the report's records, the same ones the terminal
table and the JSON file format; every string from them is escaped. This module puts the
page together and writes its first parts, the verdict and the figure cards; the chart
(:mod:`~bisect_onnx.report.html_chart`), the tables (:mod:`~bisect_onnx.report.html_tables`)
and the culprit (:mod:`~bisect_onnx.report.html_culprit`) have modules of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import InputError
from bisect_onnx.report.html_chart import chart_section
from bisect_onnx.report.html_culprit import culprit_section
from bisect_onnx.report.html_markup import (
    TOLERANCE_RULE,
    definitions,
    element,
    escaped,
    mapping,
    module_label,
    page,
    section,
)
from bisect_onnx.report.html_tables import (
    comparisons_section,
    not_compared_section,
    outputs_section,
)
from bisect_onnx.report.verdict import ops_scope
from bisect_onnx.sources.output_paths import check_report_path

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Report

__all__ = ["render_html", "write_html"]


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    body = "".join([
        _verdict_section(report),
        _figures_section(report),
        chart_section(report),
        culprit_section(report),
        _sweep_section(report),
        comparisons_section(report),
        outputs_section(report),
        not_compared_section(report),
    ])
    title = "bisect-onnx: " + report.summary().partition(":")[0]
    where = report.culprit or report.first_divergence
    if where is not None:
        title += " at " + module_label(where)
    return page(title, element("main", body))


def write_html(report: Report, path: Path) -> None:
    """Write the HTML report to ``path``, a file the user named."""
    check_report_path(report, path, "--html")
    try:
        Path(path).write_text(render_html(report), encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the HTML report to {path}: {error.strerror}; "
                         "choose a writable path for --html") from error


def _verdict_section(report: Report) -> str:
    """The verdict line, then the warnings and the note."""
    headline, _, rest = report.summary().partition(":")
    verdict = element("p", element("strong", escaped(headline)) + escaped(":" + rest),
                      class_="verdict " + ("diverged" if report.diverged else "parity"))
    parts = [element("h1", "bisect-onnx report"), verdict]
    if report.warnings:
        items = "".join(element("li", escaped(warning)) for warning in report.warnings)
        parts.append(element("ul", items, class_="warnings"))
    if report.note:
        parts.append(element("p", element("strong", "note: ") + escaped(report.note),
                             class_="note"))
    return element("header", "".join(parts))


def _figures_section(report: Report) -> str:
    """Tolerances, coverage, environment and the two models side by side."""
    cards = [
        ("tolerances", _tolerances(report)),
        ("coverage", _coverage(report)),
        ("environment", mapping(report.environment)),
        ("PyTorch side", mapping(report.reference)),
        ("ONNX side", mapping(report.candidate)),
    ]
    return element("section", "".join(
        element("div", element("h3", escaped(title)) + content, class_="card")
        for title, content in cards
    ), class_="cards", id="figures")


def _tolerances(report: Report) -> str:
    """rtol, atol and the rule they define."""
    figures = definitions([("rtol", escaped(f"{report.rtol:g}")),
                           ("atol", escaped(f"{report.atol:g}"))])
    rule = element("p", escaped(f"an element fails when {TOLERANCE_RULE}"), class_="muted small")
    return figures + rule


def _coverage(report: Report) -> str:
    """How much of each side was compared."""
    coverage = report.coverage
    rows = [
        ("granularity", escaped(coverage.granularity)),
        ("values compared", _of(coverage.aligned_values, coverage.onnx_values)),
        ("module calls", _of(coverage.aligned_modules, coverage.torch_modules)),
        ("nodes attributed", _of(coverage.attributed_nodes, coverage.onnx_nodes)),
    ]
    if coverage.torch_ops:
        rows += [("torch ops compared", _of(coverage.compared_ops, coverage.torch_ops)
                  + escaped(ops_scope(coverage))),
                 ("ops fused", escaped(coverage.fused_ops)),
                 ("op-named float values compared",
                  _of(coverage.fx_named_compared, coverage.fx_named_values))]
    rows += [("hidden divergences", escaped(len(report.hidden_divergences))),
             ("not compared", escaped(len(report.unaligned) + len(report.onnx_unaligned)))]
    return definitions(rows)


def _of(part: int, whole: int) -> str:
    """``part of whole`` as HTML."""
    return escaped(f"{part} of {whole}")


def _sweep_section(report: Report) -> str:
    """The sweep's combinations, the bisected one marked; nothing without a sweep."""
    from bisect_onnx.report.sweep_text import sweep_html

    if report.sweep is None:
        return ""
    return section("sweep: shapes and input scales", sweep_html(report.sweep), id_="sweep")
