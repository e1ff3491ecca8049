"""Bisection over ordered checkpoints: the first value that fails, in O(log N) probes.

A full capture promotes every value at once. Two cases need something else: the
values of both sides do not fit in memory together, or capturing them changes what
ONNX Runtime computes (a bug that lives only inside a fused kernel disappears once
the values around it are graph outputs). Then values are *probed* a few at a time in
an otherwise untouched production graph, and the probes bisect the ordered
checkpoints for the first one that fails, assuming (as every layer-by-layer
comparison does) that a value computed from a failing value fails too.

This module is the search, and only the search: it knows checkpoint names and a
probe that says which of a few of them fail. It never builds a session
(:mod:`bisect_onnx.search.probes` does), so it is tested with fake probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Probe", "ProbeSearch", "Prober"]

#: Says for each named checkpoint whether it fails (``True``), passes (``False``) or
#: could not be compared (``None``: not computed, another shape).
Prober = Callable[[Sequence[str]], Mapping[str, bool | None]]


@dataclass(frozen=True)
class Probe:
    """One probe: the checkpoints it marked and how each fared."""

    values: tuple[str, ...]
    results: dict[str, bool | None] = field(default_factory=dict)


class ProbeSearch:
    """Binary search (``per_probe`` + 1-ary) for the first failing checkpoint.

    Known at the start: the graph inputs pass (before the first checkpoint) and the
    final outputs fail (after the last), unless told otherwise. Each probe marks up
    to ``per_probe`` checkpoints evenly spaced between the last known passing and
    the first known failing one; a checkpoint that cannot be compared is left out
    and its neighbours are tried instead.
    """

    def __init__(self, checkpoints: Sequence[str], *, per_probe: int = 1) -> None:
        if per_probe < 1:
            raise ValueError(f"per_probe must be at least 1, got {per_probe}")
        self.checkpoints = list(dict.fromkeys(checkpoints))
        self.per_probe = per_probe
        self.low = -1
        """Index of the last checkpoint known to pass (-1: the graph inputs)."""
        self.high = len(self.checkpoints)
        """Index of the first checkpoint known to fail (the count: the final outputs)."""
        self.uncomparable: set[int] = set()
        self.probes: list[Probe] = []

    @property
    def done(self) -> bool:
        """Nothing left to probe between the last passing and the first failing value."""
        return not self._open()

    @property
    def first_failing(self) -> str | None:
        """The first checkpoint found to fail (``None``: only the final outputs do)."""
        return self.checkpoints[self.high] if self.high < len(self.checkpoints) else None

    @property
    def last_passing(self) -> str | None:
        """The last checkpoint before it found to pass (``None``: the graph inputs)."""
        return self.checkpoints[self.low] if self.low >= 0 else None

    @property
    def uncompared_between(self) -> list[str]:
        """Checkpoints between the two that could not be compared, in order."""
        return [self.checkpoints[index] for index in range(self.low + 1, self.high)]

    def next_probe(self) -> list[str]:
        """The checkpoints to mark next, in graph order; empty when done."""
        open_ = self._open()
        count = min(self.per_probe, len(open_))
        picks = sorted({open_[len(open_) * (part + 1) // (count + 1)]
                        for part in range(count)})
        return [self.checkpoints[index] for index in picks]

    def record(self, values: Sequence[str], results: Mapping[str, bool | None]) -> None:
        """Take in one probe's results and narrow the interval."""
        probe = Probe(tuple(values), {name: results.get(name) for name in values})
        self.probes.append(probe)
        position = {name: index for index, name in enumerate(self.checkpoints)}
        indices = sorted(position[name] for name in values if name in position)
        for index in indices:
            if probe.results[self.checkpoints[index]] is None:
                self.uncomparable.add(index)
        failing = [index for index in indices
                   if probe.results[self.checkpoints[index]] and self.low < index < self.high]
        if failing:
            self.high = failing[0]
        passing = [index for index in indices
                   if probe.results[self.checkpoints[index]] is False
                   and self.low < index < self.high]
        if passing:
            self.low = passing[-1]

    def run(self, probe: Prober) -> ProbeSearch:
        """Probe until done."""
        while not self.done:
            values = self.next_probe()
            self.record(values, probe(values))
        return self

    def _open(self) -> list[int]:
        return [index for index in range(self.low + 1, self.high)
                if index not in self.uncomparable]
