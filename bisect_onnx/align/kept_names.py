"""Names a rewrite kept for another tensor: such pairs by name are not compared.

A simplifier turning a 3-D MatMul into a 2-D Gemm keeps the name for a value of another
shape (:func:`reshaped`). onnxsim folds a ``BatchNormalization`` into the ``Conv`` before
it and keeps the Conv's node and output names (``node_conv1d`` -> ``conv1d``) for the
folded result (:func:`taken_over`): the candidate's ``conv1d`` holds what the reference
calls ``getitem``, the BatchNorm's output. Paired by name, the two ``conv1d`` would be
another tensor against the reference's, and a local check of the Conv would claim a
divergence that nothing computes differently. The sign is in the nodes that read it: a
node named and typed alike in both graphs reads, at one input, the name in the
candidate and, in the reference, a value computed from that name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.align.onnx_pairs import ValuePair

__all__ = ["taken_over", "reshaped", "TAKEN_OVER", "NAME_KEPT_FOR_OTHER_SHAPE"]

NAME_KEPT_FOR_OTHER_SHAPE = (
    "the candidate's value of this name has another shape ({candidate} against {reference}): "
    "a rewrite (a simplifier turning a 3-D MatMul into a 2-D Gemm) kept the name for "
    "another tensor, so the two are not compared")
TAKEN_OVER = (
    "the candidate's value of this name is a later one (a simplifier folded the nodes "
    "after it into the node computing it and kept its name), so the two are not compared; "
    "the reference's later value is paired with it instead")


def taken_over(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> dict[str, str]:
    """Candidate value name -> the later reference value it holds instead of its namesake.

    Only where the candidate's node computing the name was rewritten (another op,
    other inputs or attributes: the Conv with the BatchNorm's scale in its weights),
    and the later value is gone from the candidate: a node a tool dropped (a scale's
    Mul) leaves the value before it as it was, and it is compared as it was.
    """
    twins = {node.name: node for node in reference.graph.node if node.name}
    producers = {output: node for node in reference.graph.node for output in node.output}
    made = {output: node for node in candidate.graph.node for output in node.output}
    held: dict[str, str] = {}
    for node in candidate.graph.node:
        twin = twins.get(node.name)
        if twin is None or twin.op_type != node.op_type or len(twin.input) != len(node.input):
            continue
        for mine, theirs in zip(node.input, twin.input, strict=True):
            if (mine and theirs and mine != theirs and theirs not in made
                    and _rewritten(made.get(mine), producers.get(mine))
                    and _computed_from(theirs, mine, producers)):
                held.setdefault(mine, theirs)
    return held


def _rewritten(node: onnx.NodeProto | None, twin: onnx.NodeProto | None) -> bool:
    """Whether the candidate's ``node`` computes otherwise than the reference's ``twin``."""
    return node is not None and twin is not None and (
        node.op_type != twin.op_type or list(node.input) != list(twin.input)
        or list(node.attribute) != list(twin.attribute))


def _computed_from(value: str, source: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether the reference computes ``value`` from ``source`` (directly or not)."""
    seen: set[str] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        producer = producers.get(current)
        if producer is None or current in seen:
            continue
        seen.add(current)
        if source in producer.input:
            return True
        stack.extend(name for name in producer.input if name)
    return False


def reshaped(pair: ValuePair, reference: np.ndarray,
             candidate_values: Mapping[str, np.ndarray]) -> bool:
    """A pair by name whose candidate holds another shape (not a quantized form of it)."""
    candidate = candidate_values.get(pair.candidate)
    return (candidate is not None and pair.how == "name"
            and np.shape(candidate) != np.shape(reference))
