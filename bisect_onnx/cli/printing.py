"""What the command prints: warnings, the table, the verdict, and the report files."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from bisect_onnx.cli.parser import EXIT_DIVERGED, EXIT_PARITY

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["print_report", "colour_wanted", "show_progress"]


def print_report(args: argparse.Namespace, report: Report) -> int:
    """Print the report as the options ask, write its files; the exit status it means."""
    from bisect_onnx.report.fixes_text import fixes_section
    from bisect_onnx.report.sweep_text import sweep_section

    for warning in report.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    colour = colour_wanted(sys.stdout)
    if not args.quiet:  # -q: the verdict only (it names the sweep's bisected combination)
        print(_paint_table(report.table(show=args.show), colour))
        print()
        sweep = sweep_section(report)
        if sweep:
            print(_paint_table(sweep, colour))
            print()
    print(_paint(report.summary(), _RED if report.diverged else _GREEN, colour))
    if report.repro is not None:  # the one file the run writes that no option names
        repro = report.repro
        print(f"repro: {repro.folder} ({len(repro.nodes)} node(s); "
              + ("`python repro.py` there exits 1 while the runtime still disagrees)"
                 if repro.reproduces else "the segment alone does not reproduce it: the "
                 "error builds up over more of the model)"))
    fixes = fixes_section(report)
    if fixes:
        print(f"\n{fixes}")
    # Each file in the format its option names, whatever its suffix.
    for path, kind in ((args.json, "json"), (args.html, "html"),
                       (args.model_explorer, "model-explorer")):
        if path is not None:
            report.save(path, format=kind)
    return EXIT_DIVERGED if report.diverged else EXIT_PARITY


_RED, _GREEN = "31", "32"
_PROGRESS = {
    "export_started": "exporting the model ({detail} exporter)…",
    "capture_started": "running {detail} and recording every value…",
    "session_started": "creating an ONNX Runtime session…",
}



def colour_wanted(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set non-empty (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _paint(text: str, code: str, colour: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if colour else text


def _paint_table(table: str, colour: bool) -> str:
    return "\n".join(_paint(line, _RED, colour) if line.startswith(">>") else line
                     for line in table.splitlines())


def show_progress(event: object) -> None:
    """Print the library's long steps on stderr (a terminal only, and not with -q)."""
    template = _PROGRESS.get(getattr(event, "kind", ""))
    if template:
        print(f"bisect-onnx: {template.format(detail=event.detail)}", file=sys.stderr)
