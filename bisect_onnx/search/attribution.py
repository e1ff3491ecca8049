"""Culprit, not symptom: which failing values were *introduced* where they fail.

"The first value out of tolerance" can be an innocent node carrying error from
upstream, or the point where slowly growing float noise crosses the line. A value is
*introduced here* when its node (or the few nodes computing it from values known to
be right), fed PyTorch's exact inputs, is still out of tolerance: its *local* check.

This module is the search, and only the search: it knows value names, the order they
fail in and a checker that says how each one fares locally. It never builds a
session (:mod:`bisect_onnx.search.local` does), so it is tested with fake checkers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["LocalResult", "Attribution", "CulpritSearch"]


@dataclass(frozen=True)
class LocalResult:
    """How one failing value fares when its node is fed PyTorch's exact inputs."""

    fails: bool
    """Out of tolerance even so: the error is introduced here."""
    excess: float
    """How far out of tolerance locally: the smallest passing atol, over the atol used
    (0 when it passes with no error at all). Ranks nodes in a gradual drift."""
    noise: bool = False
    """It fails locally, but only by float rounding (both sides agree in float64): not a
    culprit to file a bug about, and the search goes on past it."""


#: Checks a batch of values at once (one session run serves them all).
Checker = Callable[[Sequence[str]], Mapping[str, LocalResult | None]]


@dataclass
class Attribution:
    """What the search found."""

    culprits: list[str] = field(default_factory=list)
    """Values that introduce error beyond float rounding, in graph order (all of them
    with ``everything``, else the first)."""
    noise: list[str] = field(default_factory=list)
    """Checked values that fail locally by float rounding only, in graph order."""
    checked: dict[str, LocalResult | None] = field(default_factory=dict)
    """Every value checked (``None``: could not be checked)."""
    drift: bool = False
    """Every failing value was checked and none introduces error beyond float rounding:
    it built up over many nodes."""
    largest_jump: str | None = None
    """In a drift, the value whose node adds the most error locally."""

    @property
    def culprit(self) -> str | None:
        """The first value that introduces error, if any."""
        return self.culprits[0] if self.culprits else None


class CulpritSearch:
    """Find the failing values whose own node introduces the error.

    ``failing`` are the failing values in graph order. The first one is checked
    alone, since it usually is the culprit; when it only inherited its error or fails
    by float rounding only, or when ``everything`` is asked for, the rest are checked
    in one more batch.
    """

    def __init__(self, failing: Sequence[str], check: Checker) -> None:
        self.failing = list(dict.fromkeys(failing))
        self.check = check

    def run(self, *, everything: bool = False) -> Attribution:
        """Check as few values as the answer needs; ``everything`` checks them all."""
        attribution = Attribution()
        if not self.failing:
            return attribution
        first, rest = self.failing[:1], self.failing[1:]
        attribution.checked.update(self._checked(first))
        if rest and (everything or not self._is_culprit(attribution, first[0])):
            attribution.checked.update(self._checked(rest))
        culprits = [name for name in self.failing if self._is_culprit(attribution, name)]
        attribution.culprits = culprits if everything else culprits[:1]
        attribution.noise = [name for name, result in attribution.checked.items()
                             if result is not None and result.fails and result.noise]
        results = {name: result for name, result in attribution.checked.items()
                   if result is not None}
        # A drift only when every failing value could be checked: an unchecked one may
        # be the culprit.
        if not culprits and results and len(results) == len(self.failing):
            attribution.drift = True
            attribution.largest_jump = max(results, key=lambda name: results[name].excess)
        return attribution

    def _checked(self, names: Sequence[str]) -> dict[str, LocalResult | None]:
        results = self.check(names)
        return {name: results.get(name) for name in names}

    @staticmethod
    def _is_culprit(attribution: Attribution, name: str) -> bool:
        result = attribution.checked.get(name)
        return result is not None and result.fails and not result.noise
