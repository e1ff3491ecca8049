"""An ONNX graph's top-level nodes as bisect-onnx reads them, and what each says of its output.

:class:`NodeInfo` is the one node type the tool reads graphs with: every runtime reads
a model's nodes with it (one per top-level node, with the torch exporter's metadata),
structural matching describes graphs with it, and every captured value takes its
provenance from its node the same way (:func:`node_provenance`). ``onnx.NodeProto``
appears only where a model is built or edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bisect_onnx.graph.provenance import Provenance, TorchMetadata, read_torch_metadata

if TYPE_CHECKING:
    import onnx

__all__ = ["NodeInfo", "read_nodes", "node_provenance"]


@dataclass(frozen=True)
class NodeInfo:
    """One top-level ONNX node with the torch exporter's metadata, if any."""

    index: int
    name: str
    op_type: str
    outputs: tuple[str, ...]
    torch: TorchMetadata | None
    inputs: tuple[str, ...] = ()
    """Input value names, ``""`` for an omitted optional input."""
    domain: str = ""
    """Operator set domain: ``""`` for standard ONNX ops, ``"com.microsoft"``, ..."""


def read_nodes(graph: onnx.GraphProto) -> list[NodeInfo]:
    """The graph's top-level nodes, an unnamed one named by its op and position."""
    return [
        NodeInfo(
            index=index,
            name=node.name or f"{node.op_type}_{index}",
            op_type=node.op_type,
            outputs=tuple(node.output),
            torch=read_torch_metadata({p.key: p.value for p in node.metadata_props}),
            inputs=tuple(node.input),
            domain=node.domain,
        )
        for index, node in enumerate(graph.node)
    ]


def node_provenance(node: NodeInfo, position: int) -> Provenance:
    """What an ONNX node says about where its output came from."""
    meta = node.torch
    return Provenance(
        position=position,
        module=meta.scopes[-1] if meta and meta.scopes else None,
        node=node.name,
        node_op=node.op_type,
        torch_op=meta.torch_op if meta else None,
        source=meta.source if meta else None,
    )
