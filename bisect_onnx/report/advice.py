"""The advice a verdict gives: what to do about a divergence, each claim on a check.

A cause is named only where the run checked it: the model in eval mode, exported
otherwise, converted or quantized with some nodes kept as they were, or run with fewer
of the runtime's optimizations reached parity; or the file was found to be another
model's export. Otherwise the culprit's classification says whom to file it with, and
an unclassified culprit's advice says what was tried and what is left to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.fixes.trial import FixKind, FixResult
from bisect_onnx.search.baked_shapes import NO_BUG

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["advice", "another_model", "cause_outside_the_graph", "baked_cause"]

#: A fix's kind -> the cause its parity shows, and what to do about it.
_CHECKED_CAUSES = {
    FixKind.EVAL_MODE: ("the model is in training mode, and in eval mode it reaches parity "
                        "(checked): {change} before exporting and comparing; no bug to file"),
    FixKind.OTHER_EXPORT: ("the export is the cause: {change} reaches parity (checked); file "
                           "the op with the exporter that made this file (pytorch/pytorch, "
                           'label "module: onnx")'),
    FixKind.LEAVE_UNQUANTIZED: ("the quantization is the cause: {change} reaches parity "
                                "(checked); quantize with those nodes excluded, no bug to file"),
    FixKind.KEEP_FLOAT32: ("the conversion to a narrower float is the cause: {change} reaches "
                           "parity (checked); convert with those nodes kept, no bug to file"),
    FixKind.DISABLE_OPTIMIZER: ("the runtime's optimization is the cause: {change} reaches "
                                "parity (checked); file it with the runtime"),
    FixKind.LOWER_OPT_LEVEL: ("the runtime's optimization is the cause: {change} reaches "
                              "parity (checked); file it with the runtime"),
}

_WHERE_PYTORCH_RUNS = ("; where PyTorch runs (the recorded command), --suggest-fix tries the "
                       "other exporter and opsets and eval mode")
_BY_HAND = ("compare the op and the ONNX segment by hand in float64 to tell the exporter from "
            "the runtime")
_BY_HAND_ONNX = ("run the culprit's node from each file alone in float64 (the repro's "
                 "segment) and compare")
#: How a PyTorch reference describes itself (the report's ``reference.kind``).
_PYTORCH_KINDS = ("torch", "exported_program", "torchscript")


def advice(report: Report) -> str:
    """What to do about the culprit: the cause a fix search checked, else its classification.

    Where a check found the cause (eval mode, another export, nodes kept unconverted,
    an optimization off, another model's file), that is said, whatever the culprit's
    node looks like on its own.
    """
    if another_model(report) is not None:
        return "the file is not this model's export (above): no bug to file"
    baked = baked_cause(report)
    if baked is not None:
        return baked
    checked = _checked_fix(report)
    if checked is not None:
        return _CHECKED_CAUSES[checked.kind].format(change=checked.change)
    kind = (report.attribution.classification if report.attribution is not None
            else None) or {}
    if not kind:
        return "not classified (which side is wrong could not be told)"
    if _training_unchecked(report):  # the likeliest cause, not yet checked
        return (f"{kind['file_with'].removeprefix('unknown: ')}; but the model is in training "
                "mode, a likelier cause: call model.eval() first (for one forward, --suggest-fix "
                "checks whether eval mode reaches parity)")
    if kind.get("kind") != "unclassified":
        return kind["file_with"].removeprefix("unknown: ")
    narrower = _narrower_precision(report)
    if narrower is not None:
        return (f"the candidate computes in {narrower}, and this node loses more than that "
                f"precision's tolerance; {_tried(report, narrower)}")
    if not _against_pytorch(report):  # two ONNX models: no torch op, no exporter to blame
        return (f"not classified: the reference is an ONNX model, so no torch op runs in "
                f"float64 to tell which side is right; {_tried(report, None)}; "
                f"{_BY_HAND_ONNX}")
    return f"not classified: {kind['detail']}; {_tried(report, None)}; {_BY_HAND}"


def _against_pytorch(report: Report) -> bool:
    """Whether the reference is PyTorch (run here, or recorded where it runs)."""
    reference = report.reference or {}
    if reference.get("kind") == "recorded reference":
        reference = reference.get("recorded") or {}
    return reference.get("kind") in _PYTORCH_KINDS


def baked_cause(report: Report) -> str | None:
    """Where the export baked in the shapes it was made at (checked): what to change.

    With the export call that keeps them symbolic, where one reached parity at the
    export's shapes and this run's.
    """
    baked = (report.attribution.baked_shapes if report.attribution is not None
             else None) or {}
    if not baked.get("advice"):
        return None
    fix = next((fix for fix in report.fixes
                if fix.kind == FixKind.SYMBOLIC_EXPORT and fix.reaches_parity), None)
    if fix is None:
        return baked["advice"]
    return (f"{baked['advice'].removesuffix(NO_BUG)}, or {fix.change}, which reaches parity "
            f"at the export's shapes and this run's (checked){NO_BUG}")


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


def _training_unchecked(report: Report) -> bool:
    """Whether the model ran in training mode and no fix search tried eval mode."""
    training = any(getattr(warning, "code", None) == "training-mode"
                   for warning in report.warnings)
    return training and not any(fix.kind == FixKind.EVAL_MODE for fix in report.fixes) and \
        not any("eval" in note for note in report.fix_notes)


def _checked_fix(report: Report) -> FixResult | None:
    """The fix whose parity names the cause: eval mode first, then the others in order."""
    order = list(_CHECKED_CAUSES)
    fixes = sorted((fix for fix in report.fixes if fix.reaches_parity and fix.kind in order),
                   key=lambda fix: order.index(fix.kind))
    return fixes[0] if fixes else None


def _narrower_precision(report: Report) -> str | None:
    """``int8 (QDQ)``, ``float16``, ``bfloat16``: what the tolerance followed, if narrower."""
    basis = report.tolerance_basis or ""
    for precision in ("int8 (QDQ)", "float16", "bfloat16"):
        if basis.startswith(f"{precision} defaults"):
            return precision
    return None


def _tried(report: Report, narrower: str | None) -> str:
    """What the run tried besides float64 to find the cause: the fix searches, if run."""
    # A check without PyTorch ran the ONNX searches only: the others are for where it runs.
    elsewhere = any(getattr(warning, "code", None) == "needs-pytorch"
                    for warning in report.warnings)
    tried = next((note for note in report.fix_notes if note.startswith("no checked fix")), None)
    if tried is not None:
        return (tried.replace("no checked fix found", "no fix search reached parity", 1)
                + (_WHERE_PYTORCH_RUNS if elsewhere else ""))
    if report.fixes or report.fix_notes:
        return "the fix searches found no cause" + (_WHERE_PYTORCH_RUNS if elsewhere else "")
    if narrower is not None:
        return ("--suggest-fix finds the nodes to leave unquantized or keep in float32, each "
                "checked by a rerun")
    if elsewhere:
        return ("--suggest-fix tries the runtime's optimizations here, and where PyTorch runs "
                "(the recorded command) the other exporter and opsets and eval mode")
    if not _against_pytorch(report):
        return "--suggest-fix tries the runtime's optimizations"
    return ("--suggest-fix tries the other exporter and opsets, eval mode and the runtime's "
            "optimizations")
