"""The search shape shared by the float32 keep-list and the QDQ exclusion list.

Start from the failing region (the culprit and its neighbours), grow it along the graph
until a rerun passes, then shrink it by delta debugging while it still passes. Each
candidate set is tried once (cached); the number of reruns is bounded by ``budget_runs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import onnx

from bisect_onnx.fixes.trial import OutputFigures

__all__ = ["neighbours", "SearchOutcome", "grow_then_shrink"]

Trial = Callable[[frozenset[str]], OutputFigures]


def neighbours(graph: onnx.GraphProto, region: Iterable[str], allowed: set[str]) -> set[str]:
    """The allowed nodes that feed or read a node of ``region`` (one step along the graph)."""
    region = set(region)
    producer = {out: node.name for node in graph.node for out in node.output}
    found: set[str] = set()
    region_outputs = {out for node in graph.node if node.name in region for out in node.output}
    for node in graph.node:
        if node.name in region:
            found.update(producer[i] for i in node.input if i in producer)
        elif any(i in region_outputs for i in node.input):
            found.add(node.name)
    return (found & allowed) - region


@dataclass(frozen=True)
class SearchOutcome:
    """The smallest passing set found (or ``None``) and the best set tried."""

    passing: frozenset[str] | None
    passing_figures: OutputFigures | None
    best: frozenset[str]
    best_figures: OutputFigures
    runs: int


def grow_then_shrink(graph: onnx.GraphProto, allowed: Sequence[str], start: Sequence[str],
                     trial: Trial, *, budget_runs: int) -> SearchOutcome:
    """Grow ``start`` until ``trial`` passes, then shrink the passing set (ddmin)."""
    allowed_set = set(allowed)
    tried: dict[frozenset[str], OutputFigures] = {}

    def attempt(nodes: frozenset[str]) -> OutputFigures | None:
        if nodes not in tried:
            if len(tried) >= budget_runs:
                return None
            tried[nodes] = trial(nodes)
        return tried[nodes]

    region = frozenset(n for n in start if n in allowed_set) or frozenset(allowed[-1:])
    figures = attempt(region)
    while figures is not None and not figures.passes:
        grown = region | neighbours(graph, region, allowed_set)
        if grown == region:
            break
        region = frozenset(grown)
        figures = attempt(region)
    if figures is None or not figures.passes:
        best = min(tried, key=lambda nodes: tried[nodes].max_abs)
        return SearchOutcome(None, None, best, tried[best], len(tried))
    smallest = _shrink(region, attempt, order=list(allowed))
    return SearchOutcome(smallest, tried[smallest], smallest, tried[smallest], len(tried))


def _shrink(passing: frozenset[str], attempt: Callable[[frozenset[str]], OutputFigures | None],
            *, order: list[str]) -> frozenset[str]:
    """Delta debugging: drop chunks (halves, quarters, ... single nodes) while it passes."""
    current = sorted(passing, key=order.index)
    chunks = 2
    while len(current) > 1:
        size = max(1, len(current) // chunks)
        removed_any = False
        for at in range(0, len(current), size):
            kept = frozenset(current[:at] + current[at + size:])
            if not kept:
                continue
            figures = attempt(kept)
            if figures is not None and figures.passes:
                current = sorted(kept, key=order.index)
                removed_any = True
                break
        if removed_any:
            chunks = max(chunks - 1, 2)
        elif size == 1:
            break
        else:
            chunks = min(len(current), chunks * 2)
    return frozenset(current)
