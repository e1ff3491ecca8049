"""The smallest segment of an ONNX graph that computes a value from values known to be right.

A repro folder (:mod:`bisect_onnx.report.repro`), the local checks
(:mod:`bisect_onnx.search.local`) and the float64 reruns (:mod:`bisect_onnx.search.blame`)
all cut the same piece out of the model: walking back from the value, nearest producers
first, to graph inputs, weights and values PyTorch computed too. This module finds that
segment, makes it a model of its own, and embeds the external weights it needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.graph.walk import subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["MAX_SEGMENT_NODES", "InputSource", "Segment", "embed_external_data",
           "find_segment", "segment_feeds", "segment_model", "segment_node_names"]

#: Past this many nodes a repro stops being one a maintainer reads; the walk back
#: stops there and ONNX Runtime's own values feed the cut (Constant nodes, and nodes
#: computed from weights alone, not counted).
MAX_SEGMENT_NODES = 200

# Where the walk stops at a weight: not an input of the segment, the initializer is copied in.
_WEIGHT = "weight"


class InputSource:
    """Where a segment input's value comes from (the values of :attr:`Segment.inputs`)."""

    REFERENCE = "reference"
    """PyTorch's value for that tensor, known to agree with ONNX Runtime's."""
    GRAPH_INPUT = "graph_input"
    """The user's input to the whole model."""
    CANDIDATE = "candidate"
    """ONNX Runtime's own value from the full run, where the segment was cut short."""


@dataclass(frozen=True)
class Segment:
    """The top-level nodes that compute a value from values known to be right."""

    nodes: list[int]
    """Indices of the top-level nodes, in graph order."""
    initializers: set[str]
    inputs: dict[str, str]
    """Frontier value -> source, in order of first use."""


def find_segment(
    graph: onnx.GraphProto,
    failing_value: str,
    *,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
) -> Segment:
    """Walk back from ``failing_value``, nearest producers first, to values known to be right.

    A value stops the walk when it is a graph input, a weight, or has a PyTorch value of
    ONNX Runtime's dtype and shape (Constant nodes are taken in instead: they are part of
    the graph, not an input).
    Past :data:`MAX_SEGMENT_NODES` nodes, what is still open is fed ONNX Runtime's value.
    """
    producers = {name: index for index, node in enumerate(graph.node)
                 for name in node.output if name}
    if failing_value not in producers:
        raise InputError(f"{failing_value!r} is not the output of any top-level node of the "
                         "ONNX graph; a repro starts from a value a node computes")
    weights = _defined_weights(graph)
    weights_only = _weights_only(graph, weights)
    included: set[int] = set()
    initializers: set[str] = set()
    frontier: dict[str, str] = {}
    counted = 0
    queue, seen = deque([failing_value]), {failing_value}
    while queue:
        name = queue.popleft()
        index = producers.get(name)
        if index in included:
            continue
        known = None if name == failing_value else _known_source(
            graph, name, index, weights, reference_values=reference_values,
            candidate_values=candidate_values, graph_inputs=graph_inputs)
        if known == _WEIGHT:
            initializers.add(name)
            continue
        if known is not None:
            frontier[name] = known
            continue
        if index is None:
            raise InputError(f"the ONNX value {name!r} needed to recompute {failing_value!r} "
                             "has no producer node, weight or given graph input")
        node = graph.node[index]
        if node.op_type != "Constant" and index not in weights_only:
            if counted == MAX_SEGMENT_NODES:
                frontier[name] = _cut_short(name, candidate_values)
                continue
            counted += 1
        included.add(index)
        for used in _used_names(node):
            if used and used not in seen:
                seen.add(used)
                queue.append(used)
    nodes = sorted(included)
    return Segment(nodes=nodes, initializers=initializers,
                   inputs=_inputs_in_order(graph, nodes, frontier, producers))


def _known_source(
    graph: onnx.GraphProto,
    name: str,
    index: int | None,
    weights: set[str],
    *,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
) -> str | None:
    """Why the walk stops at ``name`` (an :class:`InputSource`, or a weight); ``None``: go on."""
    if name in graph_inputs:
        return InputSource.GRAPH_INPUT
    if name in weights:
        return _WEIGHT
    is_constant = index is not None and graph.node[index].op_type == "Constant"
    if name in reference_values and not is_constant and _fits(
            reference_values[name], candidate_values.get(name)):
        return InputSource.REFERENCE
    return None


def _weights_only(graph: onnx.GraphProto, weights: set[str]) -> set[int]:
    """The nodes computed from weights and constants alone, by index.

    They are not counted towards :data:`MAX_SEGMENT_NODES`: the runtime computes them
    from the file's weights whatever the input, so taking them in costs a repro nothing
    a reader follows, and cutting them would need the candidate's value of a tensor
    production's capture never holds (BEiT's relative position bias: ~250 nodes made
    from its table, fed to every attention as a mask).
    """
    known, found = set(weights), set()
    for index, node in enumerate(graph.node):
        if all(not name or name in known for name in _used_names(node)):
            found.add(index)
            known.update(node.output)
    return found


def _cut_short(name: str, candidate_values: Mapping[str, np.ndarray]) -> str:
    """The source of a value still open after :data:`MAX_SEGMENT_NODES` nodes: the candidate's."""
    if name not in candidate_values:
        raise InputError(f"the repro segment is cut at {name!r} after {MAX_SEGMENT_NODES} "
                         "nodes, but the candidate's value of it was not given")
    return InputSource.CANDIDATE


def _inputs_in_order(graph: onnx.GraphProto, nodes: list[int], frontier: Mapping[str, str],
                     producers: Mapping[str, int]) -> dict[str, str]:
    """The frontier values the segment reads, in order of first use.

    A frontier value may turn out to come from a node taken in later for another of
    its outputs; then the segment computes it, and it is no input.
    """
    included = set(nodes)
    order = [name for index in nodes for name in _used_names(graph.node[index])]
    return {name: frontier[name] for name in dict.fromkeys(order)
            if name in frontier and producers.get(name) not in included}


def _fits(reference: np.ndarray, candidate: np.ndarray | None) -> bool:
    """Whether PyTorch's value can stand in for ONNX Runtime's (same dtype and shape)."""
    if candidate is None:
        return True
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    return reference.dtype == candidate.dtype and reference.shape == candidate.shape


def _defined_weights(graph: onnx.GraphProto) -> set[str]:
    return ({tensor.name for tensor in graph.initializer}
            | {sparse.values.name for sparse in graph.sparse_initializer})


def _used_names(node: onnx.NodeProto) -> list[str]:
    """A node's inputs, including the outer values its subgraphs (If, Loop, Scan) read."""
    names = list(node.input)
    for attribute in node.attribute:
        for subgraph in subgraphs(attribute):
            names.extend(_outer_names(subgraph))
    return names


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    defined = {value.name for value in graph.input} | _defined_weights(graph)
    outer = []
    for node in graph.node:
        outer.extend(name for name in _used_names(node) if name and name not in defined)
        defined.update(node.output)
    outer.extend(value.name for value in graph.output if value.name not in defined)
    return outer


def segment_feeds(segment: Segment, *, reference_values: Mapping[str, np.ndarray],
                  candidate_values: Mapping[str, np.ndarray],
                  graph_inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The array each input of ``segment`` is fed, from the pool its source names."""
    pools = {InputSource.REFERENCE: reference_values, InputSource.CANDIDATE: candidate_values,
             InputSource.GRAPH_INPUT: graph_inputs}
    return {name: np.asarray(pools[source][name]) for name, source in segment.inputs.items()}


def segment_node_names(graph: onnx.GraphProto, segment: Segment) -> list[str]:
    """The names of the segment's nodes (``<op>_<index>`` for an unnamed one), in graph order."""
    return [graph.node[index].name or f"{graph.node[index].op_type}_{index}"
            for index in segment.nodes]


def segment_model(model: onnx.ModelProto, segment: Segment, feeds: Mapping[str, np.ndarray],
                  output: str, output_value: np.ndarray) -> onnx.ModelProto:
    """The segment as a model of its own, typed from the arrays that feed and leave it."""
    import onnx

    graph = model.graph

    def typed(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
        return onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)

    initializers = [tensor for tensor in graph.initializer if tensor.name in segment.initializers]
    inputs = [typed(name, array) for name, array in feeds.items()]
    if model.ir_version < 4:  # before IR 4 every initializer is also a graph input
        inputs += [onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
                   for tensor in initializers]
    repro_graph = onnx.helper.make_graph(
        [graph.node[index] for index in segment.nodes],
        "bisect_onnx_repro",
        inputs,
        # Typed from ONNX Runtime's value: that is what the nodes produce, even where
        # PyTorch's dtype or shape differs.
        [typed(output, output_value)],
        initializer=initializers,
        sparse_initializer=[sparse for sparse in graph.sparse_initializer
                            if sparse.values.name in segment.initializers],
        doc_string=f"bisect-onnx repro: the nodes of {model.graph.name or 'the model'} "
                   f"that compute {output!r} from values known to be right",
    )
    # make_graph and make_model copy what they are given: the caller's model is untouched.
    return onnx.helper.make_model(
        repro_graph,
        opset_imports=list(model.opset_import),
        functions=list(model.functions),
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
    )


def embed_external_data(tensor: onnx.TensorProto, model_dir: Path) -> None:
    """Read an external tensor's bytes from ``model_dir`` into the tensor itself."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if not uses_external_data(tensor):
        return
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"),
                    "")
    root = model_dir.resolve()
    if not location or not (root / location).resolve().is_relative_to(root):
        raise InputError(f"the weight {tensor.name!r} keeps its data at {location!r}, outside "
                         f"the model's folder {model_dir}; bisect-onnx reads external data "
                         "only from beside the .onnx file: move it there and fix the location")
    try:
        load_external_data_for_tensor(tensor, str(root))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise InputError(f"cannot read the external data of weight {tensor.name!r} from "
                         f"{root / location}: {error}; is the weights file beside the "
                         ".onnx file complete?") from error
    # Older onnx releases leave the tensor marked external after loading its bytes.
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]
