"""The QDQ fix: the smallest set of nodes to leave unquantized (``nodes_to_exclude``).

Each trial removes the Q/DQ pairs of a set of nodes in a copy
(:func:`bisect_onnx.fixes.qdq_strip.without_qdq`) and reruns it against the float
reference; the set is found by the search of :mod:`bisect_onnx.fixes.precision_search`
(grow the failing region until it passes, shrink it while it still passes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from bisect_onnx.errors import InputError
from bisect_onnx.fixes.precision_rerun import Rerun, check_copy_fits, run_model
from bisect_onnx.fixes.precision_search import grow_then_shrink
from bisect_onnx.fixes.qdq_strip import without_qdq
from bisect_onnx.fixes.trial import FixKind, FixResult
from bisect_onnx.judge.tolerances import Tolerance

__all__ = ["find_nodes_to_exclude"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def find_nodes_to_exclude(reference: onnx.ModelProto, candidate_qdq: onnx.ModelProto,
                          inputs: Mapping[str, np.ndarray], *, tolerance: Tolerance,
                          start: Sequence[str] = (), model_dir: Path | None = None,
                          budget_runs: int = 60, max_memory: int | None = None,
                          ) -> list[FixResult]:
    """The nodes to leave unquantized so the QDQ candidate matches the float reference.

    Returns one fix that reaches parity or, where none does within ``budget_runs``
    reruns, the best improvement tried (not a fix); ``[]`` where it already passes.
    ``model_dir`` is unused (the caller loads external data) and kept for a uniform call.
    """
    del model_dir
    began = time.perf_counter()
    check_copy_fits(candidate_qdq, max_memory)
    compute = [n.name for n in candidate_qdq.graph.node if n.name and n.op_type not in _QDQ
               and any(_reads_dequantized(candidate_qdq.graph, n))]
    if not compute:
        raise InputError("the QDQ fix search needs a model with QuantizeLinear/DequantizeLinear "
                         "pairs around named nodes")
    rerun = Rerun(run_model(reference, inputs), inputs, tolerance=tolerance)
    before = rerun.figures(candidate_qdq)
    if before.passes:
        return []
    outcome = grow_then_shrink(
        _compute_graph(candidate_qdq.graph), compute, start,
        lambda nodes: rerun.failing_or(lambda: without_qdq(candidate_qdq, nodes, reference)),
        budget_runs=budget_runs)
    chosen = outcome.passing if outcome.passing is not None else outcome.best
    fixed = without_qdq(candidate_qdq, chosen, reference)
    after = rerun.figures(fixed)
    exclude = sorted(chosen, key=compute.index)
    details = {"nodes_to_exclude": exclude, "nodes_left_unquantized": len(exclude),
               "quantized_nodes": len(compute), "reruns": rerun.runs,
               "how": "onnxruntime.quantization.quantize_static(..., "
                      "nodes_to_exclude=nodes_to_exclude)"}
    change = f"leave {len(exclude)} of {len(compute)} nodes unquantized: {', '.join(exclude)}"
    return [FixResult(FixKind.LEAVE_UNQUANTIZED, change, before, after, details,
                      fixed.SerializeToString(), time.perf_counter() - began)]


def _reads_dequantized(graph: onnx.GraphProto, node: onnx.NodeProto):
    """For each input of ``node``: whether a DequantizeLinear produces it."""
    dequantized = {out for n in graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    return (name in dequantized for name in node.input)


def _compute_graph(graph: onnx.GraphProto) -> onnx.GraphProto:
    """The graph with Q/DQ nodes bypassed, so neighbours are compute nodes."""
    source = {}
    for node in graph.node:
        if node.op_type in _QDQ:
            source[node.output[0]] = node.input[0]

    def resolve(name: str) -> str:
        while name in source:
            name = source[name]
        return name

    bypassed = onnx.GraphProto()
    for node in graph.node:
        if node.op_type in _QDQ:
            continue
        copy = bypassed.node.add()
        copy.CopyFrom(node)
        copy.input[:] = [resolve(name) for name in node.input]
    return bypassed
