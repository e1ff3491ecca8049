"""The fix stage: the culprit's class, the searches for it, what they add to the findings.

Runs only with ``suggest_fix``; every result it adds to a sample's findings is a
:class:`~bisect_onnx.fixes.trial.FixResult`, made from a rerun's figures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bisect_onnx.errors import UsageError
from bisect_onnx.fixes import (  # noqa: F401  (each registers its searches)
    baked_fix,
    eval_mode,
    exporter_search,
    onnx_searches,
    optimizer_fix,
)
from bisect_onnx.fixes.context import FixContext
from bisect_onnx.fixes.registry import FixOutcome, suggest_fixes
from bisect_onnx.fixes.trial import FixKind, FixResult, output_figures
from bisect_onnx.judge.assembly import amended

if TYPE_CHECKING:
    from bisect_onnx.judge.reading import Reading
    from bisect_onnx.judge.records import Report

__all__ = ["culprit_class", "FixesFound", "search_fixes", "check_write_fixed", "write_fixed",
           "best_fix"]

logger = logging.getLogger(__name__)


def culprit_class(reading: Reading, *, precision: str | None = None) -> str | None:
    """The class a fix search starts from: the culprit's classification's kind.

    ``precision``: for ONNX against ONNX, the candidate's precision ("float16",
    "bfloat16", "qdq") where it is narrower than the reference's; it names the class
    whatever the culprit's node, since the conversion is what a fix undoes.
    """
    if precision:
        return precision
    kind = ((reading.attribution.classification if reading.attribution else None)
            or {}).get("kind")
    return _CLASS_OF_KIND.get(kind, kind) or None


# A classification's kind where the fix searches name the class otherwise: against
# PyTorch, a graph that means something else than the torch op is the exporter's doing.
_CLASS_OF_KIND = {"graph semantics": "exporter"}

class FixesFound(NamedTuple):
    """What the fix stage adds to a sample's findings: checked fixes, and its notes."""

    fixes: tuple[FixResult, ...] = ()
    notes: tuple[str, ...] = ()


def search_fixes(reading: Reading, precision: str | None = None, also: tuple[str, ...] = (),
                 **context: Any) -> FixesFound:
    """The fix searches' results for the culprit a sample's findings name (a diverged run).

    ``context``: the :class:`FixContext` fields besides the culprit's class and
    ``before`` (computed here from ``reference_outputs`` and ``candidate_outputs``).
    ``also``: classes searched whatever the culprit's (a model in training mode is one
    whatever node its divergence first shows in).
    """
    if not reading.diverged:
        return FixesFound(notes=("no fix searched: the outputs agree",))
    found = culprit_class(reading, precision=precision)
    if context.get("opt_level") not in (None, "disabled"):
        also = (*also, "optimization")  # run optimized: a fusion may be what changed it
    classes = [kind for kind in dict.fromkeys((found, *also)) if kind]
    if not classes:
        return FixesFound(notes=("no fix search: the culprit is not classified",))
    tolerance = context["tolerance"]
    before = output_figures(context["reference_outputs"], context.get("candidate_outputs", ()),
                            rtol=tolerance.rtol, atol=tolerance.atol)
    culprit = reading.culprit
    context.setdefault("culprit_nodes", (culprit.onnx_node,) if culprit and
                       culprit.onnx_node else ())
    context.setdefault("culprit_module", culprit.torch_module if culprit else None)
    ran_in = (reading.culprit_node.ran_in if reading.culprit_node else None) or {}
    context["extra"] = {"culprit_kernel": ran_in.get("kernel"), **context.get("extra", {})}
    outcomes = []
    # Eval mode first: where it reaches parity the model's mode is the cause, and no
    # other export is tried (nor an exporter's issue script written for a sound op).
    for kind in sorted(classes, key=lambda kind: kind != _EVAL_MODE_CLASS):
        if kind == "exporter" and _eval_mode_reaches_parity(outcomes):
            continue
        outcomes.append(suggest_fixes(FixContext(culprit_class=kind, before=before,
                                                 **context)))
    found_any = [result for outcome in outcomes for result in outcome.results]
    results = tuple(result for result in found_any if _helps(result))
    tried = [name for outcome in outcomes for name in outcome.tried]
    # A class with no search is only worth a note where nothing else was tried.
    notes = [reason for outcome in outcomes for reason in outcome.reasons
             if tried == [] or not reason.startswith("no fix search for")]
    notes += [f"tried {result.change}: the error stays (max abs {result.after.max_abs:.2e})"
              for result in found_any if not _helps(result)]
    if not any(result.reaches_parity for result in results):
        notes.append(f"no checked fix found (tried: {', '.join(tried) or 'nothing'})")
    return FixesFound(results, tuple(notes))


#: The class whose search tries the model in eval mode.
_EVAL_MODE_CLASS = "pytorch mode"


def _eval_mode_reaches_parity(outcomes: list[FixOutcome]) -> bool:
    return any(result.kind == FixKind.EVAL_MODE and result.reaches_parity
               for outcome in outcomes for result in outcome.results)


#: A change that leaves the worst error within this factor of the failing run's is no
#: improvement: it is said as tried, not listed as a fix ("improves it x1/1").
_NO_IMPROVEMENT = 1.5


def _helps(result: FixResult) -> bool:
    """Whether a result reaches parity or makes the worst error clearly smaller."""
    return result.reaches_parity or result.factor >= _NO_IMPROVEMENT


def best_fix(fixes: tuple[FixResult, ...]) -> FixResult | None:
    """The fix to write: parity reached, a model to write, smallest remaining error."""
    models = [fix for fix in fixes if fix.reaches_parity and fix.fixed_model is not None]
    return min(models, key=lambda fix: fix.after.max_abs, default=None)


def check_write_fixed(path: str | Path | None, user_paths: tuple[object, ...]) -> None:
    """Refuse ``--write-fixed`` onto a user's file, or into a folder that does not exist."""
    if path is None:
        return
    from bisect_onnx.sources.output_paths import same_file

    target = Path(path).expanduser().resolve()
    for user in user_paths:
        # (a hard link of an input too: writing it would truncate the input's bytes)
        if user is not None and isinstance(user, (str, Path)) and \
                same_file(Path(user).expanduser(), target):
            raise UsageError(f"--write-fixed {path} is one of the input files; the user's files "
                             "are never written: choose another path")
    if not target.parent.is_dir():
        raise UsageError(f"--write-fixed {path}: the folder {target.parent} does not exist; "
                         "create it or choose another path")


def write_fixed(report: Report, path: str | Path | None,
                user_paths: tuple[object, ...]) -> Report:
    """Write the best fix's model to ``path``; the report, with a note of what was written."""
    if path is None:
        return report
    check_write_fixed(path, user_paths)
    fix = best_fix(report.fixes)
    if fix is None:
        note = f"--write-fixed {path}: nothing written, no checked fix is a model"
    else:
        Path(path).write_bytes(fix.fixed_model)
        note = f"the fixed model ({fix.change}) was written to {path}"
    logger.info(note)
    return amended(report, fix_notes=(*report.fix_notes, note))


