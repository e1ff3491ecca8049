"""What a reference was aligned to: the ONNX graph's structure and weights, as digests.

Not the file's bytes: the same graph saved again (another protobuf layout, its weights
moved to external data, its metadata stripped) is the same graph. Nodes (name, op,
domain, inputs, outputs, attributes), the graph's inputs and outputs with their types,
the opsets, and each initializer's name and values are digested; the digest of all of
them is the graph's. Each part's digest is kept too, so a file that differs is told
where (:func:`difference`), in one line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__all__ = ["GraphDigest", "graph_digest", "difference"]

#: Hex digits kept of each part's digest: 64 bits, against chance collisions of parts.
_PART = 16


@dataclass(frozen=True)
class GraphDigest:
    """The digests of one graph's parts, and of the whole."""

    sha256: str
    opsets: tuple[str, ...]
    """``domain:version`` of each opset import."""
    inputs: tuple[str, ...]
    """``name: type`` of each graph input."""
    outputs: tuple[str, ...]
    """``name: type`` of each graph output."""
    nodes: tuple[tuple[str, str, str], ...]
    """``(name, op type, digest)`` of each node, in graph order."""
    initializers: Mapping[str, str]
    """Initializer name -> digest of its dtype, shape and values."""

    def to_json(self) -> dict[str, Any]:
        """As the manifest holds it."""
        return {"sha256": self.sha256, "opsets": list(self.opsets),
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "nodes": [list(node) for node in self.nodes],
                "initializers": dict(self.initializers)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GraphDigest:
        """The digest :meth:`to_json` gave (types checked by the manifest's reader)."""
        return cls(str(data["sha256"]), tuple(data["opsets"]), tuple(data["inputs"]),
                   tuple(data["outputs"]), tuple(tuple(node) for node in data["nodes"]),
                   dict(data["initializers"]))


def graph_digest(model: onnx.ModelProto, base_dir: Path) -> GraphDigest:
    """The digest of ``model``'s graph; external weights are read from ``base_dir``.

    Weights are read one at a time (a large model's are never all held).
    """
    graph = model.graph
    opsets = tuple(sorted(f"{entry.domain or 'ai.onnx'}:{entry.version}"
                          for entry in model.opset_import))
    inputs = tuple(f"{value.name}: {_type_text(value.type)}" for value in graph.input)
    outputs = tuple(f"{value.name}: {_type_text(value.type)}" for value in graph.output)
    nodes = tuple((node.name, node.op_type, _node_digest(node)) for node in graph.node)
    initializers = {tensor.name: _tensor_digest(tensor, base_dir)
                    for tensor in graph.initializer}
    whole = hashlib.sha256(json.dumps(
        [opsets, inputs, outputs, nodes, sorted(initializers.items()),
         [_function_digest(function) for function in model.functions]]).encode())
    return GraphDigest(whole.hexdigest(), opsets, inputs, outputs, nodes, initializers)


def difference(recorded: GraphDigest, here: GraphDigest) -> str | None:
    """Where the graph here differs from the recorded one, in words; ``None``: it does not."""
    if recorded.sha256 == here.sha256:
        return None
    for what, before, after in (("opsets", recorded.opsets, here.opsets),
                                ("graph inputs", recorded.inputs, here.inputs),
                                ("graph outputs", recorded.outputs, here.outputs)):
        if before != after:
            return f"its {what} are {_listed(after)}, recorded {_listed(before)}"
    nodes = _node_difference(recorded.nodes, here.nodes)
    if nodes is not None:
        return nodes
    for name, digest in recorded.initializers.items():
        if name not in here.initializers:
            return f"it has no initializer {name!r}"
        if here.initializers[name] != digest:
            return f"initializer {name!r} holds other values"
    extra = next((name for name in here.initializers if name not in recorded.initializers),
                 None)
    if extra is not None:
        return f"it has an initializer {extra!r} the recorded graph has not"
    return "its local functions differ"


def _node_difference(recorded: tuple[tuple[str, str, str], ...],
                     here: tuple[tuple[str, str, str], ...]) -> str | None:
    for position, (before, after) in enumerate(zip(recorded, here, strict=False)):
        if before == after:
            continue
        if before[:2] != after[:2]:
            return (f"node {position} is {after[0]!r} ({after[1]}), recorded {before[0]!r} "
                    f"({before[1]})")
        return f"node {after[0]!r} ({after[1]}) has other inputs, outputs or attributes"
    if len(recorded) != len(here):
        return f"it has {len(here)} nodes, recorded {len(recorded)}"
    return None


def _listed(items: Iterable[str]) -> str:
    text = ", ".join(items) or "none"
    return text if len(text) <= 160 else text[:160] + "…"


def _type_text(value_type: onnx.TypeProto) -> str:
    """A value's type as text: ``float32[1,3,?]`` (or the type's kind)."""
    if not value_type.HasField("tensor_type"):
        return value_type.WhichOneof("value") or "?"
    import onnx

    tensor = value_type.tensor_type
    name = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    if not tensor.HasField("shape"):
        return f"{name}[?]"
    dims = ",".join(str(dim.dim_value) if dim.HasField("dim_value")
                    else dim.dim_param or "?" for dim in tensor.shape.dim)
    return f"{name}[{dims}]"


def _node_digest(node: onnx.NodeProto) -> str:
    """What the node computes: its op, domain, wiring and attributes (not its metadata)."""
    digest = hashlib.sha256(json.dumps(
        [node.domain, node.op_type, list(node.input), list(node.output)]).encode())
    for attribute in sorted(node.attribute, key=lambda attribute: attribute.name):
        if attribute.doc_string:
            attribute = type(attribute).FromString(attribute.SerializeToString())
            attribute.ClearField("doc_string")
        digest.update(attribute.SerializeToString(deterministic=True))
    return digest.hexdigest()[:_PART]


def _tensor_digest(tensor: onnx.TensorProto, base_dir: Path) -> str:
    """An initializer's dtype, shape and values, however the file stores them."""
    import numpy as np

    from bisect_onnx.graph.weights import tensor_values

    array = np.ascontiguousarray(tensor_values(tensor, base_dir))
    digest = hashlib.sha256(f"{array.dtype.str}{list(array.shape)}".encode())
    if array.dtype.hasobject:  # a string tensor
        digest.update(json.dumps([str(item) for item in array.reshape(-1)]).encode())
    else:
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()[:_PART]


def _function_digest(function: onnx.FunctionProto) -> str:
    return hashlib.sha256(function.SerializeToString(deterministic=True)).hexdigest()[:_PART]
