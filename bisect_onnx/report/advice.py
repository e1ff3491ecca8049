"""The advice a verdict gives: what to do about a divergence, each claim on a check.

A cause is named only where the run checked it: the model in eval mode, or exported
otherwise, reached parity; the file was found to be another model's export. Otherwise
the culprit's classification says whom to file it with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.fixes.trial import FixKind

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["advice", "another_model", "cause_outside_the_graph"]


def advice(report: Report) -> str:
    """What to do about the culprit: whom to file it with, by its classification.

    Where the fix search checked that the model in eval mode reaches parity, that is the
    cause, whatever the culprit's node looks like on its own: no bug to file.
    """
    eval_mode = next((fix for fix in report.fixes
                      if fix.kind == FixKind.EVAL_MODE and fix.reaches_parity), None)
    if eval_mode is not None:
        return (f"the model is in training mode, and in eval mode it reaches parity "
                f"(checked): {eval_mode.change} before exporting and comparing; no bug to file")
    if another_model(report) is not None:
        return "the file is not this model's export (above): no bug to file"
    kind = (report.attribution or {}).get("classification") or {}
    other_export = next((fix for fix in report.fixes
                         if fix.kind == FixKind.OTHER_EXPORT and fix.reaches_parity), None)
    if other_export is not None:  # the exporter's doing, checked by exporting otherwise
        return (f"the export is the cause: {other_export.change} reaches parity (checked); "
                "file the op with the exporter that made this file (pytorch/pytorch, label "
                '"module: onnx")')
    if not kind:
        return "not classified (which side is wrong could not be told)"
    if kind.get("kind") == "unclassified":
        return f"not classified: {kind['detail']}; {_tried(report)}; {_BY_HAND}"
    return kind["file_with"].removeprefix("unknown: ")


_BY_HAND = ("compare the op and the ONNX segment by hand in float64 to tell the exporter from "
            "the runtime")


def _tried(report: Report) -> str:
    """What the run tried besides float64 to find the cause: the fix searches, if run."""
    tried = next((note for note in report.fix_notes if note.startswith("no checked fix")), None)
    if tried is not None:
        return tried.replace("no checked fix found", "no other export, mode or optimization "
                             "level reached parity", 1)
    if report.fixes or report.fix_notes:
        return "the fix searches found no cause"
    return ("--suggest-fix tries the other exporter and opsets, eval mode and the runtime's "
            "optimizations")


def another_model(report: Report) -> str | None:
    """The warning that the ONNX file is another model's export, if the run found so."""
    return next((warning for warning in report.warnings
                 if getattr(warning, "code", None) == "another-model"), None)


def cause_outside_the_graph(report: Report) -> str | None:
    """Why no node of the file is to be filed upstream; ``None`` where none is known.

    Where a check found the cause elsewhere: the model's mode, or a file that is not
    its export.
    """
    if any(fix.kind == FixKind.EVAL_MODE and fix.reaches_parity for fix in report.fixes):
        return ("the model in eval mode reaches parity (checked): the cause is its training "
                "mode, no node of the file")
    if another_model(report) is not None:
        return "the ONNX file is not this model's export"
    return None
