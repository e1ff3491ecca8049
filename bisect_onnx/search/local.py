"""Run failing values' nodes on PyTorch's exact inputs: their *local* error.

For each value, the smallest segment that computes it from values known to be right
(:func:`bisect_onnx.report.repro.find_segment`: one node for most ops, the MatMul and
Add of a Linear, the nodes of one module call at module level) is copied into one
model under its own prefix, its inputs fed PyTorch's values (ONNX Runtime's where
PyTorch has none, and the report says so). One session and one run then give every
value's local result, however many there are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.judge.compare import ArrayComparison, compare_arrays
from bisect_onnx.report.repro import InputSource, Segment, find_segment
from bisect_onnx.runtime.onnx_side import create_session, subgraphs

__all__ = ["LocalCheck", "run_locally"]

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


def run_locally(
    model: Any,
    model_dir: Path,
    values: Sequence[str],
    *,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
    rtol: float,
    atol: float,
    provider: str,
    opt_level: str,
    compare: Callable[[str, np.ndarray], ArrayComparison] | None = None,
) -> dict[str, LocalCheck]:
    """Check each of ``values`` locally, all in one ONNX Runtime run.

    A value PyTorch has but the capture does not (inside a kernel ONNX Runtime fused)
    is not a place to cut: the segment goes back through it to a captured value, so
    the fused kernel is rerun whole, and its inner values are compared afterwards.
    ``compare`` judges a value's local result (value name, array) where its reference
    needs converting or a tolerance of its own (another ONNX model's value); by
    default ``compare_arrays`` against ``reference_values`` at ``rtol`` and ``atol``.
    A value without a reference value is not checked.
    """
    import onnx

    graph = model.graph
    checkpoints = {name: array for name, array in reference_values.items()
                   if name in candidate_values}
    pools = {InputSource.REFERENCE: reference_values, InputSource.CANDIDATE: candidate_values,
             InputSource.GRAPH_INPUT: graph_inputs}
    checks = {value: LocalCheck(value) for value in values}
    nodes, initializers, inputs, outputs, feeds = [], set(), [], [], {}
    for number, value in enumerate(values):
        check = checks[value]
        if value not in reference_values:
            check.reason = "no reference value of its type to compare it with"
            continue
        try:
            segment = find_segment(graph, value, reference_values=checkpoints,
                                   candidate_values=candidate_values, graph_inputs=graph_inputs)
        except BisectOnnxError as error:
            check.reason = str(error)
            continue
        if any(next(subgraphs(attribute), None) is not None
               for index in segment.nodes for attribute in graph.node[index].attribute):
            check.reason = "its nodes hold subgraphs (If, Loop), which are not copied"
            continue
        check.segment = segment
        check.nodes = [graph.node[index].name or f"{graph.node[index].op_type}_{index}"
                       for index in segment.nodes]
        check.feeds = {name: np.asarray(pools[source][name])
                       for name, source in segment.inputs.items()}
        prefix = f"local{number}/"
        renamed = {name: prefix + name for index in segment.nodes
                   for name in graph.node[index].output if name}
        renamed.update({name: f"{prefix}in/{name}" for name in segment.inputs})
        for index in segment.nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(graph.node[index])
            copy.name = prefix + (copy.name or f"{copy.op_type}_{index}")
            copy.input[:] = [renamed.get(name, name) for name in copy.input]
            copy.output[:] = [renamed.get(name, name) for name in copy.output]
            nodes.append(copy)
        for name, array in check.feeds.items():
            inputs.append(onnx.helper.make_tensor_value_info(
                renamed[name], onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
            feeds[renamed[name]] = array
        initializers.update(segment.initializers)
        outputs.extend(onnx.ValueInfoProto(name=renamed[name]) for index in segment.nodes
                       for name in graph.node[index].output if name)
    if not outputs:
        return checks

    local_model = onnx.helper.make_model(
        onnx.helper.make_graph(
            nodes, "bisect_onnx_local", inputs, outputs,
            initializer=[tensor for tensor in graph.initializer if tensor.name in initializers]),
        opset_imports=list(model.opset_import), functions=list(model.functions),
        ir_version=model.ir_version)
    try:
        session = create_session(local_model.SerializeToString(), model_dir=model_dir,
                                 label="local checks", provider=provider, opt_level=opt_level)
        fetched = [output.name for output in outputs]
        results = dict(zip(fetched, session.run(fetched, feeds), strict=True))
    except Exception as error:  # the report stands without attribution
        logger.info("local checks could not run: %s", error)
        for check in checks.values():
            check.reason = check.reason or f"the local run failed: {error}"
        return checks
    for number, value in enumerate(values):
        check = checks[value]
        prefix = f"local{number}/"
        check.values = {name[len(prefix):]: np.asarray(array) for name, array in results.items()
                        if name.startswith(prefix)}
        local = check.values.get(value)
        if local is None:
            continue
        check.local = local
        check.comparison = (compare(value, local) if compare is not None
                            else compare_arrays(reference_values[value], local, rtol=rtol,
                                                atol=atol))
    logger.info("ran %d value(s) locally in one session (%d nodes)", len(outputs), len(nodes))
    return checks
