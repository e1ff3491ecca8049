"""An ONNX graph reduced to what structural matching reads, and walks over it.

:func:`describe_model` is the one function of structural matching that imports onnx
(when called): it turns a model into a :class:`GraphDescription` of its nodes (:class:`NodeInfo`),
value types and constant arrays. :mod:`bisect_onnx.align.structural` pairs two such
descriptions; the helpers below answer the questions it asks of one graph (who
produces a value, which nodes are constants, what lies upstream).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo, read_nodes
from bisect_onnx.graph.weights import tensor_values

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ValueSpec", "UNKNOWN_SPEC", "GraphDescription", "describe_model",
    "constant_node_value", "content_key", "producers", "is_constant_node", "output_at",
    "strip_omitted", "walk_up",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValueSpec:
    """What is known of a value's type: parts left ``None`` are unknown and fit anything."""

    shape: tuple[int | None, ...] | None
    """Dimensions (``None`` for a symbolic one), or ``None`` when even the rank is unknown."""
    dtype: str | None
    """Numpy dtype name, ``"float32"``."""

    def fits(self, other: ValueSpec) -> bool:
        """Whether the two could describe one tensor."""
        if self.dtype is not None and other.dtype is not None and self.dtype != other.dtype:
            return False
        if self.shape is None or other.shape is None:
            return True
        return len(self.shape) == len(other.shape) and all(
            a is None or b is None or a == b for a, b in zip(self.shape, other.shape, strict=True))


UNKNOWN_SPEC = ValueSpec(None, None)


@dataclass(frozen=True)
class GraphDescription:
    """A graph reduced to what structural matching reads; build it with :func:`describe_model`."""

    nodes: Sequence[NodeInfo]
    inputs: Sequence[str]
    """Graph inputs in order, initializers excluded."""
    specs: Mapping[str, ValueSpec]
    """Shape and dtype of each value, where known."""
    constants: Mapping[str, np.ndarray]
    """Initializers and ``Constant`` node outputs, by name."""
    outputs: Sequence[str] = ()
    """Graph outputs in order."""
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Run-time values (graph inputs included) from one run; used only to break ties."""

    def spec(self, name: str) -> ValueSpec:
        """The value's known type, :data:`UNKNOWN_SPEC` when nothing is known."""
        return self.specs.get(name, UNKNOWN_SPEC)


def content_key(array: np.ndarray) -> str:
    """Equal exactly when dtype, shape and bytes are: what makes two initializers one."""
    array = np.ascontiguousarray(array)
    digest = hashlib.blake2b(array.tobytes(), digest_size=16)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    return digest.hexdigest()


def walk_up(starts: Iterable[str], nodes: Sequence[NodeInfo], producers: Mapping[str, int],
            *, through: Callable[[str], bool], limit: int) -> Iterator[str | None]:
    """Yield each value at or above ``starts``, walking up through those ``through`` accepts.

    Yields ``None`` and stops once the walk has passed ``limit`` producers.
    """
    stack, seen, walked = list(starts), set(), set()
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        yield name
        producer = producers.get(name)
        if producer is None or producer in walked or not through(name):
            continue
        walked.add(producer)
        if len(walked) > limit:
            yield None
            return
        stack.extend(nodes[producer].inputs)


def producers(nodes: Sequence[NodeInfo]) -> dict[str, int]:
    """Value name -> index of the node that computes it."""
    return {name: index for index, node in enumerate(nodes) for name in node.outputs if name}


def is_constant_node(node: NodeInfo, constants: Mapping[str, np.ndarray]) -> bool:
    """Whether every output is a known constant: nothing to pair, matched by content."""
    outputs = [name for name in node.outputs if name]
    return bool(outputs) and all(name in constants for name in outputs)


def output_at(node: NodeInfo, position: int) -> str:
    """The node's output at ``position``, ``""`` where it has none."""
    return node.outputs[position] if position < len(node.outputs) else ""


def strip_omitted(names: Sequence[str]) -> tuple[str, ...]:
    """Drop trailing omitted optionals, which ONNX lets a writer spell or leave out."""
    names = tuple(names)
    while names and not names[-1]:
        names = names[:-1]
    return names


def describe_model(
    model: onnx.ModelProto,
    values: Mapping[str, np.ndarray] | None = None,
    *,
    base_dir: str = "",
    graph_inputs: Sequence[np.ndarray] = (),
) -> GraphDescription:
    """Describe a model's top-level graph for :func:`~bisect_onnx.align.structural.match_graphs`.

    Shapes come from ONNX shape inference, falling back on what the file records
    (a model over protobuf's 2 GB limit cannot be inferred in memory).

    Args:
        model: The model; it is not modified.
        values: Run-time values by name, to break ties.
        base_dir: Folder holding the model's external data, when it has some.
        graph_inputs: The run-time values of the graph's inputs, in order (the same
            arrays on both sides of a match).

    Returns:
        The nodes in file order, the graph inputs, every value's known type, and
        the initializers and ``Constant`` outputs as arrays.
    """
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except ValueError as error:
        logger.debug("shape inference skipped: %s", error)
    graph = model.graph
    # An initializer no node reads (left behind by an edit) must not pair with a
    # template weight the foreign nodes no longer use.
    used = {name for node in graph.node for name in node.input}
    constants = {tensor.name: tensor_values(tensor, base_dir)
                 for tensor in graph.initializer if tensor.name in used}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            array = constant_node_value(node)
            if array is not None:
                constants[node.output[0]] = array
    specs = {info.name: _spec_of(info.type)
             for info in (*graph.input, *graph.value_info, *graph.output)}
    inputs = [info.name for info in graph.input if info.name not in constants]
    return GraphDescription(
        nodes=read_nodes(graph),
        inputs=inputs,
        outputs=[info.name for info in graph.output],
        specs={name: spec for name, spec in specs.items() if spec is not None},
        constants=constants,
        values={**(values or {}), **dict(zip(inputs, graph_inputs, strict=False))},
    )


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The array a ``Constant`` node yields; ``None`` for string and sparse forms."""
    from onnx import helper, numpy_helper

    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if attribute.name == "value":
            return numpy_helper.to_array(value)
        if attribute.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attribute.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    return None


def _spec_of(type_proto: onnx.TypeProto) -> ValueSpec | None:
    """Shape and dtype of a tensor type; ``None`` for sequences, maps and optionals."""
    from onnx import helper

    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    dtype = (np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
             if tensor.elem_type else None)
    shape = (tuple(dim.dim_value if dim.HasField("dim_value") else None
                   for dim in tensor.shape.dim)
             if tensor.HasField("shape") else None)
    return ValueSpec(shape, dtype)
