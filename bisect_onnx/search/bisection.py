"""The search for the first failing value, by probes, along what the graph guarantees.

A full capture promotes every value at once. Two cases need something else: the
values of both sides do not fit in memory together, or capturing them changes what
ONNX Runtime computes (a bug that lives only inside a fused kernel disappears once
the values around it are graph outputs). Then values are *probed* a few at a time in
an otherwise untouched production graph.

A probe's pass says something only about the values that one was computed from. So
the search does not bisect values in topological order (across parallel branches
that is no monotone sequence: a pass on a residual block's shortcut says nothing of
its other branch). It bisects the chain of *cuts* of the failing value (the values
every path to it goes through, :class:`~bisect_onnx.search.value_graph.ValueGraph`),
where a pass does mean the error enters later; then it looks at every value of the
segment between the last passing cut and the first failing one, several per probe.
A value found failing there becomes the failing value, and the search goes on among
its own ancestors, until the failing value's every ancestor since the last passing
cut is known to pass: it is the first failing value, and the error entered at it (or
at values between it and them that could not be compared).

Values the capture session saw fail (``suspects``) are probed first: if one fails in
production too, the search looks only at its ancestors.

This module is the search, and only the search: it knows value names, the graph
between them, and a probe that says which of a few of them fail. It never builds a
session (:mod:`bisect_onnx.search.probes` does), so it is tested with fake probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bisect_onnx.search.value_graph import ValueGraph

__all__ = ["Probe", "ProbeSearch", "Prober"]

#: Says for each named checkpoint whether it fails (``True``), passes (``False``) or
#: could not be compared (``None``: not computed, another shape).
Prober = Callable[[Sequence[str]], Mapping[str, bool | None]]

#: Stands for "one of the failing outputs" where several are known to fail.
_FAILING_OUTPUTS = "\0failing outputs"


@dataclass(frozen=True)
class Probe:
    """One probe: the checkpoints it marked and how each fared."""

    values: tuple[str, ...]
    results: dict[str, bool | None] = field(default_factory=dict)


class ProbeSearch:
    """Finds the first failing checkpoint among the ancestors of a failing value.

    ``failing``: values known to fail (the failing final outputs); by default every
    value nothing reads. ``per_probe``: how many cuts one probe marks while
    bisecting the chain (``per_probe`` + 1-ary search). ``segment_size``: how many
    values of a segment one probe marks. ``suspects``: values to probe first (those
    the capture session saw fail).
    """

    def __init__(self, graph: ValueGraph, checkpoints: Sequence[str], *,
                 failing: Sequence[str] = (), per_probe: int = 1, segment_size: int = 32,
                 suspects: Sequence[str] = ()) -> None:
        if per_probe < 1 or segment_size < 1:
            raise ValueError(f"per_probe and segment_size must be at least 1, got "
                             f"{per_probe} and {segment_size}")
        self.checkpoints = sorted((name for name in dict.fromkeys(checkpoints)
                                   if name in graph), key=graph.order.__getitem__)
        """The values that can be probed (on the data path), in graph order."""
        self._probeable = set(self.checkpoints)
        self.per_probe = per_probe
        self.segment_size = segment_size
        self.results: dict[str, bool | None] = {}
        """Every probed value's result."""
        self.probes: list[Probe] = []
        failing = [name for name in dict.fromkeys(failing) if name in graph] or [
            name for name in graph.parents if name not in _read(graph)]
        if len(failing) == 1:
            self.target = failing[0]
        else:
            graph = graph.joined(_FAILING_OUTPUTS, failing)
            self.target = _FAILING_OUTPUTS
        """The earliest value known to fail; the culprit is among its ancestors."""
        self.graph = graph
        self.results.update({name: True for name in failing})
        self.low: str | None = None
        """The last cut known to pass (``None``: the graph inputs)."""
        self.suspects = _earliest(graph, [name for name in suspects
                                          if name in self._probeable])
        """The first of the suspects on each branch: those probed first."""

    @property
    def done(self) -> bool:
        """Every value between the last passing cut and the failing value is known."""
        return not self.next_probe()

    @property
    def first_failing(self) -> str | None:
        """The first checkpoint found to fail (``None``: only the final outputs do)."""
        self._narrow()
        return self.target if self.target in self._probeable else None

    @property
    def last_passing(self) -> str | None:
        """The last cut before it found to pass (``None``: the graph inputs)."""
        self._narrow()
        return self.low

    @property
    def uncompared_between(self) -> list[str]:
        """Checkpoints between the two that could not be compared, in order."""
        self._narrow()
        return [name for name in self._segment() if self.results.get(name, False) is None]

    def next_probe(self) -> list[str]:
        """The checkpoints to mark next, in graph order; empty when done."""
        self._narrow()
        unknown = [name for name in self._segment() if name not in self.results]
        inside = set(unknown)
        suspects = [name for name in self.suspects if name in inside]
        if suspects:
            return suspects[:self.segment_size]
        cuts = [name for name in self.graph.dominators(self.target)
                if name in inside]
        if cuts:
            count = min(self.per_probe, len(cuts))
            return sorted({cuts[len(cuts) * (part + 1) // (count + 1)]
                           for part in range(count)}, key=self.graph.order.__getitem__)
        return unknown[:self.segment_size]

    def record(self, values: Sequence[str], results: Mapping[str, bool | None]) -> None:
        """Take in one probe's results."""
        probe = Probe(tuple(values), {name: results.get(name) for name in values})
        self.probes.append(probe)
        self.results.update({name: result for name, result in probe.results.items()
                             if name in self.graph})

    def run(self, probe: Prober) -> ProbeSearch:
        """Probe until done."""
        while values := self.next_probe():
            self.record(values, probe(values))
        return self

    def _narrow(self) -> None:
        """Move the failing value and the last passing cut to what the results show."""
        graph = self.graph
        while True:
            passing = [name for name in graph.dominators(self.target)
                       if self.results.get(name, True) is False]
            self.low = passing[-1] if passing else None
            failing = [name for name in self._segment_values()
                       if name != self.target and self.results.get(name) is True]
            if not failing:
                return
            self.target = min(failing, key=graph.order.__getitem__)

    def _segment_values(self) -> frozenset[str]:
        """The failing value's ancestors after the last passing cut."""
        ancestors = self.graph.ancestors(self.target)
        return ancestors - self.graph.ancestors(self.low) if self.low else ancestors

    def _segment(self) -> list[str]:
        """The checkpoints among them (the failing value not included), in graph order."""
        inside = self._segment_values()
        return [name for name in self.checkpoints if name in inside and name != self.target]


def _read(graph: ValueGraph) -> set[str]:
    return {parent for parents in graph.parents.values() for parent in parents}


def _earliest(graph: ValueGraph, names: Sequence[str]) -> list[str]:
    """Those of ``names`` none of the others is computed from, in graph order."""
    chosen = set(names)
    return sorted((name for name in chosen
                   if not (graph.ancestors(name) - {name}) & chosen),
                  key=graph.order.__getitem__)
