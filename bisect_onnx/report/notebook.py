"""The report in a Jupyter notebook: ``Report._repr_html_``.

A compact view, not the whole page: the verdict, the warnings, the culprit's node and
source line, and the comparison rows around it. It speaks the Python API, not the
command line: a hint that the terminal gives as ``--show all`` reads ``show="all"``
here. Every string from the report is escaped; the style is scoped to this block.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from bisect_onnx.report.html_culprit import source_facts
from bisect_onnx.report.html_markup import (
    breakable,
    definitions,
    element,
    escaped,
    module_label,
)
from bisect_onnx.report.html_tables import records_table

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["notebook_html", "api_wording"]

# Tables longer than this are cut to a window around the culprit, as in the terminal.
_WINDOW_THRESHOLD = 40
_WINDOW_RADIUS = 8
_HIDDEN_HINT = 'print(report.table(show="all")) for every row'
# The command line's options in the report's sentences, and their API spelling.
_API_WORDS = {
    "--show all": 'show="all"',
    "--repro-dir": "OutputOptions(repro_dir=...)",
    "--all-culprits": "SearchOptions(all_culprits=True)",
    "--max-memory": "RuntimeOptions(max_memory=...)",
    "--exporter torchscript": 'ExportOptions(exporter="torchscript")',
    "--exporter dynamo": 'ExportOptions(exporter="dynamo")',
    "--onnx": "onnx_model=",
    "--rtol": "Tolerance(rtol=...)",
    "--atol": "Tolerance(atol=...)",
    "--opt-level": "RuntimeOptions(opt_level=...)",
    "--promote all": 'RuntimeOptions(promote="all")',
    "--granularity": "SearchOptions(granularity=...)",
    "--sweep": "SearchOptions(sweep=True)",
}
_FLAG = re.compile("|".join(re.escape(flag) for flag in sorted(_API_WORDS, key=len,
                                                                   reverse=True)))
_STYLE = """
.bisect-onnx { font: 13px/1.45 system-ui, sans-serif; }
.bisect-onnx .verdict { border-left: 5px solid; padding: 6px 10px; margin: 0 0 8px; }
.bisect-onnx .verdict.diverged { border-color: #cf222e; }
.bisect-onnx .verdict.parity { border-color: #1a7f37; }
.bisect-onnx .warnings { background: #fff8c5; padding: 6px 6px 6px 24px; }
.bisect-onnx dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
.bisect-onnx dd { margin: 0; }
.bisect-onnx .scroll { overflow-x: auto; }
.bisect-onnx table { font: 12px ui-monospace, Menlo, monospace; border-collapse: collapse; }
.bisect-onnx th, .bisect-onnx td { padding: 2px 6px; text-align: left; vertical-align: top; }
.bisect-onnx td.fig, .bisect-onnx th { white-space: nowrap; }
.bisect-onnx tr.first-divergence td { background: #fff3c4; }
.bisect-onnx tr.culprit td { background: #ffe0e0; font-weight: 600; }
.bisect-onnx tr.gap td { color: #57606a; font-style: italic; text-align: center; }
"""


def api_wording(text: str) -> str:
    """A sentence of the report with the command line's options in the API's words."""
    return _FLAG.sub(lambda match: _API_WORDS[match.group(0)], text)


def notebook_html(report: Report) -> str:
    """The report as an HTML block for a notebook cell's output."""
    parts = [element("style", _STYLE), _verdict(report)]
    if report.warnings:
        parts.append(element("ul", "".join(element("li", escaped(api_wording(warning)))
                                           for warning in report.warnings),
                             class_="warnings"))
    where = report.culprit or report.first_divergence
    if where is not None:
        parts.append(definitions(_culprit_facts(report, where)))
    if report.sweep is not None:
        from bisect_onnx.report.sweep_text import sweep_html

        parts.append(sweep_html(report.sweep))
    if report.comparisons:
        rows = _window(report)
        parts.append(records_table(rows, report, table_id="bisect-onnx-comparisons",
                                   row_prefix="bisect-onnx-row-", hidden_hint=_HIDDEN_HINT,
                                   last_index=report.comparisons[-1].index))
    return element("div", "".join(parts), class_="bisect-onnx")


def _verdict(report: Report) -> str:
    """The verdict line, its headline in bold."""
    headline, _, rest = api_wording(report.summary()).partition(":")
    return element("p", element("strong", escaped(headline)) + escaped(":" + rest),
                   class_="verdict " + ("diverged" if report.diverged else "parity"))


def _culprit_facts(report: Report, record: Record) -> list[tuple[str, str]]:
    """Where the error starts: node, op, module, source line and call site."""
    what = "culprit" if record is report.culprit else "first divergence"
    return [
        (what, element("code", breakable(record.onnx_node or record.onnx_value))
         + escaped(f" ({record.onnx_op})" if record.onnx_op else "")),
        ("torch module", element("code", breakable(module_label(record)))),
        *source_facts(record.source),
    ]


def _window(report: Report) -> list[Record]:
    """The comparison rows to show: all of a short table, else those around the culprit."""
    rows = report.comparisons
    if len(rows) <= _WINDOW_THRESHOLD:
        return list(rows)
    focus_record = next((record for record in (report.culprit, report.first_divergence)
                         if record is not None and any(row is record for row in rows)), None)
    focus = focus_record.index if focus_record is not None else rows[-1].index
    return [row for row in rows if abs(row.index - focus) <= _WINDOW_RADIUS]
