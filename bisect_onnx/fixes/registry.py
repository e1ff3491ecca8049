"""Which fix searches run for which culprit class, and collecting what they find.

A search plugs in with one line, ``register("float16", search_float16)``; the
dispatcher runs every search registered for the culprit's class and returns their
:class:`~bisect_onnx.fixes.trial.FixResult`s with the one-line reason of each search
that could not run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.fixes.context import CULPRIT_CLASSES, FixContext, FixUnavailable
from bisect_onnx.fixes.trial import FixResult
from bisect_onnx.pytorch.module_side import model_untouched

__all__ = ["Search", "FixOutcome", "register", "searches_for", "suggest_fixes"]

logger = logging.getLogger(__name__)

Search = Callable[[FixContext], Sequence[FixResult]]

_SEARCHES: dict[str, list[Search]] = {}


def register(culprit_class: str, search: Search) -> Search:
    """Run ``search`` for culprits of ``culprit_class`` (returns it, to decorate with)."""
    if culprit_class not in CULPRIT_CLASSES:
        raise ValueError(f"unknown culprit class {culprit_class!r}: one of {CULPRIT_CLASSES}")
    found = _SEARCHES.setdefault(culprit_class, [])
    if search not in found:
        found.append(search)
    return search


def searches_for(culprit_class: str) -> tuple[Search, ...]:
    """The searches registered for a culprit class, in registration order."""
    return tuple(_SEARCHES.get(culprit_class, ()))


@dataclass(frozen=True)
class FixOutcome:
    """What the fix stage found: checked results, and why searches could not run."""

    results: tuple[FixResult, ...]
    reasons: tuple[str, ...] = ()
    tried: tuple[str, ...] = ()
    """The names of the searches that ran (for "no checked fix found: tried ...")."""

    @property
    def fixes(self) -> tuple[FixResult, ...]:
        """The results that reach parity, best (smallest remaining error) first."""
        return tuple(sorted((r for r in self.results if r.reaches_parity),
                            key=lambda r: r.after.max_abs))


def suggest_fixes(context: FixContext) -> FixOutcome:
    """Run every search for ``context.culprit_class``; a failing search gives a reason."""
    searches = searches_for(context.culprit_class)
    if not searches:
        return FixOutcome((), (f"no fix search for a {context.culprit_class} culprit",))
    results: list[FixResult] = []
    reasons: list[str] = []
    tried: list[str] = []
    for search in searches:
        name = getattr(search, "__name__", repr(search))
        tried.append(name)
        started = time.perf_counter()
        try:
            # Each search finds the model as the user gave it: an export of a model in
            # training mode runs it, and its BatchNorms' statistics move.
            with model_untouched(context.torch_model):
                found = search(context)
        except (FixUnavailable, BisectOnnxError) as error:
            reasons.append(f"no fix search: {error}")
            continue
        logger.info("fix search %s: %d result(s) in %.2fs", name, len(found),
                    time.perf_counter() - started)
        results.extend(found)
    return FixOutcome(tuple(results), tuple(reasons), tuple(tried))
