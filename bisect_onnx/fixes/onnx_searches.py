"""The ONNX-against-ONNX fix searches, plugged into the registry.

A float16/bfloat16 candidate gets the float32 keep-list search
(:func:`~bisect_onnx.fixes.precision_fix.find_float32_keep_list`), a QDQ candidate the
``nodes_to_exclude`` search (:func:`~bisect_onnx.fixes.qdq_fix.find_nodes_to_exclude`);
both rerun copies against the float reference with the run's own tolerance and start
from the culprit's nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.precision_fix import find_float32_keep_list
from bisect_onnx.fixes.qdq_fix import find_nodes_to_exclude
from bisect_onnx.fixes.registry import register
from bisect_onnx.fixes.trial import FixResult

__all__ = ["search_float32_keep_list", "search_nodes_to_exclude"]


def _arguments(context: FixContext) -> dict:
    """What both searches take from the run: sample, tolerance, start, memory budget."""
    if context.reference is None:
        raise FixUnavailable("no float32 ONNX reference to rerun the candidate against")
    directory = context.candidate_path.parent if context.candidate_path else None
    return {"inputs": context.inputs, "tolerance": context.tolerance,
            "start": context.culprit_nodes, "model_dir": directory,
            "max_memory": context.memory_budget}


def search_float32_keep_list(context: FixContext) -> Sequence[FixResult]:
    """The smallest set of nodes to keep in float32 (a ``node_block_list``)."""
    return find_float32_keep_list(context.reference, context.candidate, **_arguments(context))


def search_nodes_to_exclude(context: FixContext) -> Sequence[FixResult]:
    """The nodes to leave unquantized (``nodes_to_exclude``), their Q/DQ pairs removed.

    A run judges a dequantized output within steps of its scale; one tolerance serves
    every output of a rerun, so it is the strictest of theirs (never a looser parity).
    """
    arguments = _arguments(context)
    arguments["tolerance"] = replace(context.tolerance, atol=min(
        _output_atols(context.candidate, context.tolerance), default=context.tolerance.atol))
    return find_nodes_to_exclude(context.reference, context.candidate, **arguments)


def _output_atols(candidate, base) -> list[float]:
    """Each final output's atol: steps of its DequantizeLinear's scale, else ``base``'s."""
    from onnx import numpy_helper

    from bisect_onnx.judge.tolerances import quantized_tolerance

    scales = {t.name: numpy_helper.to_array(t) for t in candidate.graph.initializer}
    producer = {out: node for node in candidate.graph.node for out in node.output}
    atols = []
    for output in candidate.graph.output:
        node = producer.get(output.name)
        scale = scales.get(node.input[1]) if node is not None and \
            node.op_type == "DequantizeLinear" else None
        atols.append(quantized_tolerance(base, float(scale.max())).atol
                     if scale is not None else base.atol)
    return atols


register("float16", search_float32_keep_list)
register("bfloat16", search_float32_keep_list)
register("qdq", search_nodes_to_exclude)
