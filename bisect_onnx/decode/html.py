"""A decode report as one self-contained HTML page, and its notebook view.

A chart of the error by step, log scale: the free-running logits and each layer's cache
entries (solid), the teacher-forced run's worst value (dashed), the tolerance's atol
(grey); then the verdict and the per-step table.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the report imports this module to show itself
    from bisect_onnx.decode.step_report import DecodeReport, StepComparison

__all__ = ["decode_html", "decode_fragment"]

_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 880, 300, 60, 150, 20, 40
_FLOOR = 1e-12  # exact zeros cannot sit on a log axis
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
          "font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
          "tr.fail td{background:#fde8e8}tr.first td{font-weight:bold}"
          ".verdict{font-size:15px;margin:1em 0;white-space:pre-wrap}")


def decode_html(report: DecodeReport) -> str:
    """The whole page."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>bisect-onnx decode: "
            f"{escape(report.model)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{escape(report.model)}: {len(report.rows) - 1} decode steps</h1>"
            f"{decode_fragment(report)}</body></html>\n")


def decode_fragment(report: DecodeReport) -> str:
    """Verdict, chart and table: the page's body, and what a notebook shows."""
    from bisect_onnx.decode.text import decode_verdict, token_lines

    tokens = "".join(f"<pre>{escape(lines)}</pre>" for lines in token_lines(report))
    return (f"<div class='verdict'>{escape(decode_verdict(report))}</div>{_chart(report)}"
            f"{tokens}{_table(report)}")


def _chart(report: DecodeReport) -> str:
    """Error by step, one line per series, log scale."""
    series = _series(report)
    values = [v for _, _, points in series for v in points if v > 0 and math.isfinite(v)]
    low = math.floor(math.log10(min(values + [report.atol, _FLOOR * 10])))
    high = math.ceil(math.log10(max(values + [report.atol * 10])))
    steps = max(len(report.rows) - 1, 1)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def x(step: int) -> float:
        return _LEFT + plot_w * step / steps

    def y(value: float) -> float:
        value = min(max(value, 10.0 ** low), 10.0 ** high) if math.isfinite(value) else 10.0 ** high
        return _TOP + plot_h * (high - math.log10(value)) / max(high - low, 1)

    parts = [f"<line x1='{_LEFT}' x2='{_LEFT + plot_w}' y1='{y(report.atol):.1f}' "
             f"y2='{y(report.atol):.1f}' stroke='#999' stroke-dasharray='2,3'/>",
             f"<text x='{_LEFT + plot_w + 4}' y='{y(report.atol) + 4:.1f}' font-size='11'>"
             "atol</text>"]
    for decade in range(low, high + 1):
        parts.append(f"<text x='{_LEFT - 6}' y='{y(10.0 ** decade) + 4:.1f}' font-size='11' "
                     f"text-anchor='end'>1e{decade}</text>")
    for step in range(0, steps + 1, max(1, steps // 16)):
        parts.append(f"<text x='{x(step):.1f}' y='{_HEIGHT - _BOTTOM + 16}' font-size='11' "
                     f"text-anchor='middle'>{step}</text>")
    parts.append(f"<text x='{_LEFT + plot_w / 2}' y='{_HEIGHT - 6}' font-size='12' "
                 "text-anchor='middle'>step (0: the prefill)</text>")
    for index, (label, dashed, points) in enumerate(series):
        colour = _COLOURS[index % len(_COLOURS)]
        path = " ".join(f"{x(step):.1f},{y(max(value, _FLOOR)):.1f}"
                        for step, value in enumerate(points))
        dash = " stroke-dasharray='5,4'" if dashed else ""
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5'{dash} "
                     f"points='{path}'><title>{escape(label)}</title></polyline>")
        parts.append(f"<text x='{_LEFT + plot_w + 4}' y='{_TOP + 14 * index + 10}' "
                     f"font-size='11' fill='{colour}'>{escape(label)}</text>")
    if report.finding is not None:
        marked = x(report.finding.step)
        parts.append(f"<line x1='{marked:.1f}' x2='{marked:.1f}' y1='{_TOP}' "
                     f"y2='{_TOP + plot_h}' stroke='#d62728' stroke-width='1'/>")
    return (f"<svg viewBox='0 0 {_WIDTH} {_HEIGHT}' width='100%' role='img' "
            f"aria-label='max abs error by step'>{''.join(parts)}</svg>")


def _series(report: DecodeReport) -> list[tuple[str, bool, list[float]]]:
    """(label, dashed, error at each step): free-running logits and layers, teacher's worst."""
    rows = report.rows
    layers = len(rows[0].free.keys) if rows else 0
    series = [("logits (free-running)", False, [row.free.logits.max_abs for row in rows])]
    series += [(f"layer {layer} cache (free)", False,
                [row.free.layer_error(layer) for row in rows]) for layer in range(layers)]
    series.append(("teacher-forced worst", True, [_worst(row.teacher) for row in rows]))
    return series


def _worst(comparison: StepComparison) -> float:
    return max([comparison.logits.max_abs] + [comparison.layer_error(layer)
                                               for layer in range(len(comparison.keys))])


def _table(report: DecodeReport) -> str:
    """The per-step table: tokens, logits and the worst cache error of each run."""
    from bisect_onnx.decode.text import decode_table_rows

    headers, rows = decode_table_rows(report)
    first = report.finding.step if report.finding else None
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row, cells in zip(report.rows, rows, strict=True):
        kind = " ".join(k for k, on in (("fail", not (row.teacher.passed and row.free.passed)),
                                        ("first", row.step == first)) if on)
        body.append(f"<tr class='{kind}'>" + "".join(f"<td>{escape(c)}</td>" for c in cells)
                    + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"
