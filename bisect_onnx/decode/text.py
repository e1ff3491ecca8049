"""A decode report as text: the per-step table, the two token sequences, the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabulate import tabulate

if TYPE_CHECKING:  # types only: the report imports this module to print itself
    from collections.abc import Sequence

    from bisect_onnx.decode.step_report import DecodeReport, StepComparison, StepRow

__all__ = ["decode_text", "decode_table", "decode_table_rows", "decode_verdict", "token_lines"]

_HEADERS = ["", "step", "position", "torch token", "teacher-forced", "free-running",
            "logits err (teacher)", "logits err (free)", "worst cache (teacher)",
            "worst cache (free)", "status"]


def decode_text(report: DecodeReport) -> str:
    """Table, token sequences and verdict, as the command prints them."""
    return "\n\n".join([decode_table(report), *token_lines(report), decode_verdict(report)])


def decode_table(report: DecodeReport) -> str:
    """A row per step; ``>>`` marks the first failing step."""
    headers, rows = decode_table_rows(report)
    return tabulate(rows, headers=headers, disable_numparse=True)


def decode_table_rows(report: DecodeReport) -> tuple[list[str], list[list[str]]]:
    """The table's headers and cells, for the text and the HTML report alike."""
    marked = report.finding.step if report.finding else None
    return _HEADERS, [_row(row, marked=row.step == marked) for row in report.rows]


def _row(row: StepRow, *, marked: bool) -> list[str]:
    status = ("pass" if row.teacher.passed and row.free.passed
              else "fail (step)" if not row.teacher.passed else "fail (cache)")
    return [">>" if marked else "", str(row.step), str(row.position), _tokens(row.reference_token),
            _tokens(row.teacher_token), _tokens(row.free_token),
            f"{row.teacher.logits.max_abs:.2e}", f"{row.free.logits.max_abs:.2e}",
            _worst(row.teacher), _worst(row.free), status]


def _tokens(tokens: Sequence[int]) -> str:
    return ",".join(str(t) for t in tokens)


def _worst(comparison: StepComparison) -> str:
    """The layer whose cache entry is furthest off, and by how much."""
    if not comparison.keys:
        return ""
    errors = [comparison.layer_error(layer) for layer in range(len(comparison.keys))]
    layer = max(range(len(errors)), key=lambda i: errors[i])
    return f"layer {layer}: {errors[layer]:.2e}"


def token_lines(report: DecodeReport) -> list[str]:
    """PyTorch's and the runtime's free-running tokens side by side, to the first difference."""
    first = report.first_token_difference()
    end = len(report.rows) if first is None else first + 1
    lines = []
    for batch_row in range(len(report.prompt)):
        torch_tokens = [str(row.reference_token[batch_row]) for row in report.rows[:end]]
        runtime_tokens = [str(row.free_token[batch_row]) for row in report.rows[:end]]
        width = [max(len(a), len(b)) for a, b in zip(torch_tokens, runtime_tokens, strict=True)]
        label = f"tokens (row {batch_row})" if len(report.prompt) > 1 else "tokens"
        agree = ("agree at every step" if first is None
                 else f"part ways at step {first}")
        lines.append(f"{label}, {agree}:\n  torch:   {_aligned(torch_tokens, width)}\n"
                     f"  runtime: {_aligned(runtime_tokens, width)}")
    return lines


def _aligned(tokens: list[str], width: list[int]) -> str:
    return " ".join(token.rjust(w) for token, w in zip(tokens, width, strict=True))


def decode_verdict(report: DecodeReport) -> str:
    """``PARITY: ...`` or ``DIVERGED: at step K ...`` in one line, and the culprit's lines."""
    steps = len(report.rows) - 1
    tolerance = f"rtol={report.rtol:g}, atol={report.atol:g}"
    finding = report.finding
    if finding is None:
        counted = f"{steps} decode step" + ("" if steps == 1 else "s")
        return (f"PARITY: prefill and {counted} within tolerance, teacher-forced "
                f"and free-running ({tolerance})")
    if finding.accumulated:
        where = (f"layer {finding.layer}'s cache entries leave tolerance first"
                 if finding.layer is not None else "only the logits leave tolerance")
        growth = " ".join(f"{e:.1e}" for e in finding.growth[:finding.step + 1])
        parted = report.first_token_difference()
        tie = (f"; the runtime chose another token at step {parted} with its logits within "
               "tolerance (a near tie), so from there on it was fed other tokens"
               if parted is not None and parted < finding.step else "")
        return (f"DIVERGED at step {finding.step} ({finding.where}): accumulated through the "
                f"cache: every teacher-forced step up to it passes; {where}; free-running "
                f"error by step: {growth}{tie} ({tolerance})")
    head = (f"DIVERGED at step {finding.step} ({finding.where}): introduced at this step: "
            f"fed PyTorch's cache and token, the runtime's step {finding.step} fails")
    if finding.culprit:
        return f"{head}\n  step {finding.step}'s bisection: {finding.culprit}"
    return f"{head} ({tolerance})"
