"""Probes: the production graph with only a few values marked as outputs.

A probe session is the user's model, as production runs it, with one or a few
values made graph outputs: everything else is fused and laid out exactly as in
production. Its optimized graph is checked against production's: it may differ only
where a marked value had to be pulled out of a fused kernel. The search itself lives
in :mod:`bisect_onnx.search.bisection`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bisect_onnx.errors import ModelError, one_line
from bisect_onnx.graph.nodes import NodeInfo, node_provenance
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays
from bisect_onnx.runtime.runner import CompiledGraph, Runner, Session
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.bisection import ProbeSearch
from bisect_onnx.search.value_graph import ValueGraph

__all__ = ["Checkpoint", "Comparer", "ProbeRunner", "ProbeBisection", "checkpoints_for",
           "values_per_probe", "CUTS_PER_PROBE", "SEGMENT_PER_PROBE"]

logger = logging.getLogger(__name__)

#: How many nodes a probe's optimized graph may add or lose per marked value that
#: production fused away: a kernel pulled apart (an attention fusion is the largest).
_CHANGE_PER_FUSED_VALUE = 16
#: Cuts one probe marks while bisecting: 3 per probe is a 4-ary search (half the
#: probes of a binary one), and each probe is a session: few values, one session.
CUTS_PER_PROBE = 3
#: Values of a segment (a residual block, an attention block: tens of values) one
#: probe marks: most segments in one probe.
SEGMENT_PER_PROBE = 32


@dataclass(frozen=True)
class Checkpoint:
    """An ONNX value with a reference value to compare it with."""

    name: str
    reference: CapturedValue
    node: NodeInfo


#: Judges a probed array against its checkpoint's reference value.
Comparer = Callable[[Checkpoint, np.ndarray], ArrayComparison]


@dataclass
class ProbeBisection:
    """What the probes found: values compared, in graph order, and how."""

    capture: Capture
    """The probed values (with the production session's final outputs)."""
    search: ProbeSearch
    graph_checks: list[str] = field(default_factory=list)
    """Per probe, how its optimized graph compares with production's."""
    references: dict[str, np.ndarray] = field(default_factory=dict)
    """The reference value of each probed value."""

    def describe(self, reason: str) -> dict[str, Any]:
        """The report's ``search`` entry."""
        def outcome(result: bool | None) -> str:
            return "not comparable" if result is None else ("fail" if result else "pass")

        return {
            "mode": "bisection",
            "reason": reason,
            "checkpoints": len(self.search.checkpoints),
            "probes": [{"values": list(probe.values),
                        "results": {name: outcome(result)
                                    for name, result in probe.results.items()},
                        "graph": check}
                       for probe, check in zip(self.search.probes, self.graph_checks,
                                               strict=False)],
            "last_passing": self.search.last_passing,
            "first_failing": self.search.first_failing,
            "uncompared_between": self.search.uncompared_between,
            "graphs_match_production": not self._beyond(),
        }

    def warnings(self) -> list[str]:
        """What the report should say about probes that changed more than they had to."""
        beyond = self._beyond()
        if not beyond:
            return []
        return [f"{len(beyond)} of {len(self.graph_checks)} probe(s) changed the production "
                f"graph beyond the values they marked ({beyond[0]}): their results may "
                "not be production's"]

    def _beyond(self) -> list[str]:
        return [check for check in self.graph_checks
                if not check.startswith(("identical", "differs only"))]


class ProbeRunner:
    """Runs the production session, then probes of it, on one input."""

    def __init__(self, candidate: Runner, inputs: Sequence[np.ndarray]) -> None:
        self.candidate = candidate
        self.feeds = {spec.name: array for spec, array in zip(candidate.inputs, inputs,
                                                              strict=True)}
        session, self.production = self._session(None)
        outputs = self._run(session, candidate.output_names)
        del session  # holds every weight; each probe brings its own
        producer_of = candidate.view.producer_of
        self.outputs = [
            CapturedValue(name, array, node_provenance(producer_of(name), index)
                          if producer_of(name) is not None else Provenance(position=index))
            for index, (name, array) in enumerate(zip(candidate.output_names, outputs,
                                                      strict=True))]
        """The production session's final outputs."""

    def bisect(self, checkpoints: Sequence[Checkpoint], *, rtol: float, atol: float,
               per_probe: int | None = None, compare: Comparer | None = None,
               suspects: Sequence[str] = (), memory_budget: int | None = None,
               ) -> ProbeBisection:
        """Probe the checkpoints for the first that fails against its reference.

        The search follows the graph (:mod:`bisect_onnx.search.bisection`): it starts
        from the final outputs that fail (checkpoints among them are judged on
        production's outputs, without a probe) and looks only at their ancestors.
        ``suspects``: values the capture session saw fail, probed first.
        ``memory_budget``: bytes the probes may use; it bounds how many values one
        probe marks (``per_probe`` cuts, or a segment's values), by default
        :data:`CUTS_PER_PROBE` and :data:`SEGMENT_PER_PROBE`. ``compare`` judges a
        probed array against its checkpoint, where the reference is not of the
        value's dtype or needs its own tolerance (another ONNX model's value, say);
        by default ``compare_arrays`` with ``rtol`` and ``atol``.
        """
        by_name = {checkpoint.name: checkpoint for checkpoint in checkpoints}
        found: dict[str, CapturedValue] = {}
        checks: list[str] = []

        def judge(name: str, array: np.ndarray) -> bool | None:
            checkpoint = by_name[name]
            comparison = (compare(checkpoint, array) if compare is not None
                          else compare_arrays(checkpoint.reference.array, array,
                                              rtol=rtol, atol=atol))
            if comparison.status in (Status.SHAPE_MISMATCH, Status.DTYPE_MISMATCH):
                return None  # named alike, not the same tensor
            found[name] = CapturedValue(name, np.asarray(array),
                                        node_provenance(checkpoint.node,
                                                        checkpoint.node.index))
            return not comparison.passed

        # Production's own outputs are judged without a probe: they say where to start.
        outputs = {value.name: judge(value.name, value.array) for value in self.outputs
                   if value.name in by_name}
        known_passing = [name for name, fails in outputs.items() if fails is False]
        failing = [name for name, fails in outputs.items() if fails] or [
            name for name in self.candidate.output_names if name not in known_passing]
        cuts, segment = values_per_probe(checkpoints, memory_budget)
        search = ProbeSearch(self.graph(), list(by_name), failing=failing,
                             per_probe=per_probe or cuts, segment_size=segment,
                             suspects=suspects)
        search.results.update({name: False for name in known_passing})

        def probe(names: Sequence[str]) -> dict[str, bool | None]:
            session, graph = self._session(names)
            checks.append(self._graph_check(names, graph))
            arrays = self._run(session, list(names))
            del session  # holds every weight; the next probe brings its own
            results = {name: judge(name, array)
                       for name, array in zip(names, arrays, strict=True)}
            logger.info("probe %s: %s", ", ".join(names), results)
            return results

        search.run(probe)
        ordered = sorted(found.values(), key=lambda value: value.provenance.position)
        return ProbeBisection(Capture(values={value.name: value for value in ordered},
                                      outputs=self.outputs), search, checks,
                              {name: by_name[name].reference.array for name in found})

    def graph(self) -> ValueGraph:
        """The data path of the candidate's graph (what the search follows)."""
        return ValueGraph.from_nodes(
            ((node.op_type, node.inputs, node.outputs) for node in self.candidate.nodes),
            [spec.name for spec in self.candidate.inputs])

    def _session(self, names: Sequence[str] | None) -> tuple[Session, CompiledGraph]:
        """A session marking ``names`` (production for ``None``), and what it compiled."""
        return self.candidate.probe_session(names)

    def _graph_check(self, names: Sequence[str], graph: CompiledGraph) -> str:
        """How the probe's optimized graph differs from production's, and whether it may."""
        production = self.production
        lost, gained = production.counts - graph.counts, graph.counts - production.counts
        if graph.nodes == production.nodes:
            return "identical to production's"
        if not lost and not gained:  # the same ops, connected otherwise
            lost = gained = Counter({"(rewired node)": sum(
                ours != theirs for ours, theirs in zip(graph.nodes, production.nodes,
                                                       strict=False))})
        changes = ", ".join([f"-{count} {op}" for op, count in sorted(lost.items())]
                            + [f"+{count} {op}" for op, count in sorted(gained.items())])
        fused_away = [name for name in names if name not in production.values]
        changed = sum(lost.values()) + sum(gained.values())
        if fused_away and changed <= _CHANGE_PER_FUSED_VALUE * len(fused_away):
            return (f"differs only where {', '.join(fused_away)} had to be pulled out of a "
                    f"fused kernel ({changes})")
        return f"differs beyond the marked values ({changes})"

    def _run(self, session: Session, fetched: list[str]) -> list[np.ndarray]:
        try:
            return [np.asarray(array) for array in session.run(fetched, self.feeds)]
        except Exception as error:
            raise ModelError(f"ONNX Runtime failed to run {self.candidate.path.name}: "
                             f"{one_line(error)}") from error


def values_per_probe(checkpoints: Sequence[Checkpoint],
                     memory_budget: int | None) -> tuple[int, int]:
    """How many cuts, and how many segment values, one probe may mark within a budget.

    The reference values are held throughout; a probe's values get what is left.
    """
    if memory_budget is None or not checkpoints:
        return CUTS_PER_PROBE, SEGMENT_PER_PROBE
    sizes = [checkpoint.reference.array.nbytes for checkpoint in checkpoints]
    room = memory_budget - sum(sizes)
    fits = max(1, room // (max(sizes) or 1))
    return min(CUTS_PER_PROBE, fits), min(SEGMENT_PER_PROBE, fits)


def checkpoints_for(candidate: Runner,
                    references: Mapping[str, CapturedValue]) -> list[Checkpoint]:
    """Every node output with a floating-point reference value, in graph order."""
    found = []
    for node in candidate.nodes:
        for output in node.outputs:
            reference = references.get(output)
            if reference is not None and reference.array.dtype.kind in "fc":
                found.append(Checkpoint(output, reference, node))
    return found
