"""Run failing values' nodes on PyTorch's exact inputs: their *local* error.

For each value, the smallest segment that computes it from values known to be right
(:func:`bisect_onnx.graph.segments.find_segment`: one node for most ops, the MatMul and
Add of a Linear, the nodes of one module call at module level) is copied into one
model under its own prefix, its inputs fed PyTorch's values (ONNX Runtime's where
PyTorch has none, and the report says so). One session and one run then give every
value's local result, however many there are.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.graph.segments import Segment, find_segment, segment_feeds, segment_node_names
from bisect_onnx.graph.walk import subgraphs
from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays
from bisect_onnx.runtime.weights_in_place import with_initializers

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.judge.tolerances import Tolerance
    from bisect_onnx.runtime.runner import Runner

__all__ = ["LocalCheck", "LocalRerun", "run_locally", "boundary_references"]

logger = logging.getLogger(__name__)


@dataclass
class LocalCheck:
    """One value's nodes run on exact inputs."""

    value: str
    segment: Segment | None = None
    nodes: list[str] = field(default_factory=list)
    """Names of the segment's nodes, in graph order."""
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    """Segment input -> the array it was fed."""
    local: np.ndarray | None = None
    """What the segment computed from those inputs."""
    values: dict[str, np.ndarray] = field(default_factory=dict)
    """Every value the segment computed from those inputs, by ONNX name (its
    intermediates too: what the nodes inside a fused kernel or a multi-node op give)."""
    comparison: ArrayComparison | None = None
    """``local`` against PyTorch's value."""
    reason: str | None = None
    """Why the value could not be checked."""


@dataclass(frozen=True)
class LocalRerun:
    """Local checks of a runner's values with references of the caller's (one run each).

    What the steps that narrow a culprit inside its segment share: the runner, the
    sample's graph inputs, the tolerance the checks are judged at, and the judge of a
    value whose reference needs converting (``None``: ``compare_arrays``).
    """

    runner: Runner
    graph_inputs: Mapping[str, np.ndarray]
    tolerance: Tolerance
    compare: Callable[[str, np.ndarray], ArrayComparison] | None = None

    def __call__(self, values: Sequence[str], *, reference_values: Mapping[str, np.ndarray],
                 candidate_values: Mapping[str, np.ndarray]) -> dict[str, LocalCheck]:
        """``values`` checked on ``reference_values`` (see :func:`run_locally`)."""
        return run_locally(self.runner, values, reference_values=reference_values,
                           candidate_values=candidate_values, graph_inputs=self.graph_inputs,
                           tolerance=self.tolerance, compare=self.compare)


def run_locally(
    runner: Runner,
    values: Sequence[str],
    *,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
    tolerance: Tolerance,
    compare: Callable[[str, np.ndarray], ArrayComparison] | None = None,
) -> dict[str, LocalCheck]:
    """Check each of ``values`` locally, all in one ONNX Runtime run.

    A value PyTorch has but the capture does not (inside a kernel ONNX Runtime fused)
    is not a place to cut: the segment goes back through it to a captured value, so
    the fused kernel is rerun whole, and its inner values are compared afterwards.
    ``compare`` judges a value's local result (value name, array) where its reference
    needs converting or a tolerance of its own (another ONNX model's value); by
    default ``compare_arrays`` against ``reference_values`` at ``rtol`` and ``atol``.
    A value without a reference value is not checked. The checks run in ``runner``'s
    own sessions (OpenVINO's in its precision). Its ``layer_boundaries``, values
    between two of production's executed layers that the
    capture could not ask for (OpenVINO): no kernel holds them, so they are cut at too,
    on the reference's values (a residual input: the segment stays one block, not the
    whole residual trunk back to a captured value). Where a value then passes, the error
    may have entered at the cut: it is checked again, back to captured values.
    """
    # Only values both sides captured stop the walk back: see above.
    captured = {name: array for name, array in reference_values.items()
                if name in candidate_values}
    layer_boundaries = runner.layer_boundaries
    run = functools.partial(
        _run_checks, runner, reference_values=reference_values,
        candidate_values=candidate_values, graph_inputs=graph_inputs,
        judge=compare if compare is not None else functools.partial(
            _against_reference, reference_values, rtol=tolerance.rtol, atol=tolerance.atol))
    checks = run(values, {**captured, **{name: array for name, array in reference_values.items()
                                          if name in layer_boundaries}})
    # A value that passes on a cut at a value production never handed out says nothing
    # of what entered there: it is checked again back to captured values.
    again = [value for value, check in checks.items()
             if check.comparison is not None and check.comparison.status == Status.PASS
             and check.segment is not None
             and any(name in layer_boundaries and name not in candidate_values
                     for name in check.segment.inputs)]
    if again:
        checks.update(run(again, captured))
    return checks


def _run_checks(runner: Runner, values: Sequence[str],
                checkpoints: Mapping[str, np.ndarray], *,
                reference_values: Mapping[str, np.ndarray],
                candidate_values: Mapping[str, np.ndarray],
                graph_inputs: Mapping[str, np.ndarray],
                judge: Callable[[str, np.ndarray], ArrayComparison]) -> dict[str, LocalCheck]:
    """``values``' segments back to ``checkpoints``, run in one session, and judged."""
    model = runner.model
    graph = model.graph
    checks = {value: LocalCheck(value) for value in values}
    combined = _CombinedSegments()
    for number, value in enumerate(values):
        check = checks[value]
        if value not in reference_values:
            check.reason = "no reference value of its type to compare it with"
            continue
        if _cut(check, graph, checkpoints, reference_values=reference_values,
                candidate_values=candidate_values, graph_inputs=graph_inputs):
            combined.add(graph, check, _prefix(number))
    if not combined.outputs:
        return checks
    local_model = combined.model(model, runner)
    try:
        results = combined.run(local_model, runner)
    except Exception as error:  # the report stands without attribution
        logger.info("local checks could not run: %s", error)
        for check in checks.values():
            check.reason = check.reason or f"the local run failed: {error}"
        return checks
    for number, value in enumerate(values):
        _read_back(checks[value], results, _prefix(number), judge)
    logger.info("ran %d value(s) locally in one session (%d nodes)", len(combined.outputs),
                len(combined.nodes))
    return checks


def boundary_references(candidate: Runner, reference_values: Mapping[str, np.ndarray],
                        torch_values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``reference_values`` with PyTorch's values of the candidate's layer boundaries.

    Values between two of production's executed layers that the capture could not ask
    for (OpenVINO) are cut at on PyTorch's values (by their FX names, a dynamo export's
    value names): no kernel holds them, and the segments stay one layer long.
    """
    return {**{name: torch_values[name] for name in candidate.layer_boundaries
               if name in torch_values},
            **reference_values}


def _prefix(number: int) -> str:
    """The prefix of the ``number``-th value's copy of its segment in the combined model."""
    return f"local{number}/"


def _cut(check: LocalCheck, graph: onnx.GraphProto, checkpoints: Mapping[str, np.ndarray], *,
         reference_values: Mapping[str, np.ndarray], candidate_values: Mapping[str, np.ndarray],
         graph_inputs: Mapping[str, np.ndarray]) -> bool:
    """Find the value's segment and its feeds; whether it can be run (else ``check.reason``)."""
    try:
        segment = find_segment(graph, check.value, reference_values=checkpoints,
                               candidate_values=candidate_values, graph_inputs=graph_inputs)
    except BisectOnnxError as error:
        check.reason = str(error)
        return False
    if any(next(subgraphs(attribute), None) is not None
           for index in segment.nodes for attribute in graph.node[index].attribute):
        check.reason = "its nodes hold subgraphs (If, Loop), which are not copied"
        return False
    check.segment = segment
    check.nodes = segment_node_names(graph, segment)
    check.feeds = segment_feeds(segment, reference_values=reference_values,
                                candidate_values=candidate_values, graph_inputs=graph_inputs)
    return True


@dataclass
class _CombinedSegments:
    """Every checked value's segment, each copied under its own prefix: one model, one run."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: set[str] = field(default_factory=set)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    feeds: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, graph: onnx.GraphProto, check: LocalCheck, prefix: str) -> None:
        """Copy ``check``'s segment in, its values renamed under ``prefix``."""
        import onnx

        segment = check.segment
        assert segment is not None
        renamed = {name: prefix + name for index in segment.nodes
                   for name in graph.node[index].output if name}
        renamed.update({name: f"{prefix}in/{name}" for name in segment.inputs})
        for index in segment.nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(graph.node[index])
            copy.name = prefix + (copy.name or f"{copy.op_type}_{index}")
            copy.input[:] = [renamed.get(name, name) for name in copy.input]
            copy.output[:] = [renamed.get(name, name) for name in copy.output]
            self.nodes.append(copy)
        for name, array in check.feeds.items():
            self.inputs.append(onnx.helper.make_tensor_value_info(
                renamed[name], onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
            self.feeds[renamed[name]] = array
        self.initializers.update(segment.initializers)
        # Every value the segment computes comes back, not only the checked one.
        self.outputs.extend(onnx.ValueInfoProto(name=renamed[name]) for index in segment.nodes
                            for name in graph.node[index].output if name)

    def model(self, model: onnx.ModelProto, runner: Runner) -> bytes:
        """The combined model, serialized, with ``model``'s weights, opsets and functions.

        The weights as ``runner`` has them in place where it does
        (:meth:`~bisect_onnx.runtime.runner.Runner.initializers_in_place`), else copied.
        """
        import onnx

        names = [tensor.name for tensor in model.graph.initializer
                 if tensor.name in self.initializers]
        in_place = runner.initializers_in_place() if names else None
        if in_place is not None and not all(name in in_place for name in names):
            in_place = None
        local = onnx.helper.make_model(
            onnx.helper.make_graph(
                self.nodes, "bisect_onnx_local", self.inputs, self.outputs,
                initializer=[] if in_place is not None else [
                    tensor for tensor in model.graph.initializer
                    if tensor.name in self.initializers]),
            opset_imports=list(model.opset_import), functions=list(model.functions),
            ir_version=model.ir_version)
        if in_place is None:
            return local.SerializeToString()
        return with_initializers(local.SerializeToString(), (in_place[name] for name in names))

    def run(self, local_model: bytes, runner: Runner) -> dict[str, np.ndarray]:
        """Every output of the combined model, by its prefixed name, in ``runner``'s session."""
        session = runner.local_session(local_model, "local checks")
        fetched = [output.name for output in self.outputs]
        return dict(zip(fetched, session.run(fetched, self.feeds), strict=True))


def _against_reference(reference_values: Mapping[str, np.ndarray], value: str,
                       local: np.ndarray, *, rtol: float, atol: float) -> ArrayComparison:
    """The default judge of a local result: ``compare_arrays`` against PyTorch's value."""
    return compare_arrays(reference_values[value], local, rtol=rtol, atol=atol)


def _read_back(check: LocalCheck, results: Mapping[str, np.ndarray], prefix: str,
               compare: Callable[[str, np.ndarray], ArrayComparison]) -> None:
    """The values ``check``'s segment computed, and the checked one's comparison."""
    check.values = {name[len(prefix):]: np.asarray(array) for name, array in results.items()
                    if name.startswith(prefix)}
    local = check.values.get(check.value)
    if local is None:
        return
    check.local = local
    check.comparison = compare(check.value, local)
