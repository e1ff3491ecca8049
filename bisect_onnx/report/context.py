"""The culprit's neighbourhood in the ONNX graph, for the HTML report and repro files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bisect_onnx.judge.report_parts import CulpritNode, NodeValue

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.judge.records import Record
    from bisect_onnx.runtime.runner import Runner
    from bisect_onnx.runtime.sides import Capture

__all__ = ["culprit_context", "where_it_ran"]

# Attribute values longer than this (a big constant tensor) are summarized, not printed.
_MAX_ATTRIBUTE_TEXT = 200


def culprit_context(
    record: Record | None,
    candidate: Runner,
    torch_capture: Capture,
    onnx_capture: Capture,
    comparisons: Sequence[Record],
) -> CulpritNode | None:
    """The first divergence's node: op, attributes, inputs and outputs with their sources.

    An input's ``source`` is ``reference`` when a compared PyTorch value holds it,
    ``initializer`` for weights, ``graph_input`` for the model's inputs, and
    ``candidate`` otherwise (an intermediate only ONNX Runtime computed).
    """
    import onnx

    if record is None or record.onnx_node is None:
        return None
    index = next((node.index for node in candidate.nodes if node.name == record.onnx_node),
                 None)
    if index is None:
        return None
    node = candidate.model.graph.node[index]
    initializers = {init.name: init for init in candidate.model.graph.initializer}
    graph_inputs = {spec.name for spec in candidate.inputs}
    compared = {item.onnx_value for item in comparisons}

    def describe(name: str) -> NodeValue:
        if name in initializers:
            init = initializers[name]
            return NodeValue(name, tuple(init.dims),
                             str(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)),
                             "initializer")
        value = onnx_capture.values.get(name)
        source = ("graph_input" if name in graph_inputs
                  else "reference" if name in compared else "candidate")
        return NodeValue(name, tuple(value.array.shape) if value else None,
                         str(value.array.dtype) if value else None, source)

    return CulpritNode(
        node=record.onnx_node,
        op_type=node.op_type,
        domain=node.domain or "ai.onnx",
        attributes={attribute.name: _attribute_text(attribute) for attribute in node.attribute},
        inputs=tuple(describe(name) for name in node.input if name),
        outputs=tuple(describe(name) for name in node.output if name),
        ran_in=where_it_ran(candidate, record),
        torch_module=record.torch_module,
        torch_op=record.torch_op,
        source=record.source,
    )


def where_it_ran(candidate: Runner, record: Record) -> dict[str, Any]:
    """Where production ran ``record``'s node: ONNX Runtime's kernel, OpenVINO's layer.

    ONNX Runtime: the kernel and provider its capture session's profile names
    (``kernel``: ``name``, ``op_type``, ``precision``, ``fused`` when the value is
    computed inside a kernel that outputs ``output``). A compiling runtime (OpenVINO):
    the layer it executed, in its inference precision.
    """
    return candidate.where_it_ran(record.onnx_value, record.onnx_node)


def _attribute_text(attribute: onnx.AttributeProto) -> str:
    import onnx

    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value) if not isinstance(value, onnx.TensorProto) else (
        f"tensor {list(value.dims)}")
    return text if len(text) <= _MAX_ATTRIBUTE_TEXT else text[:_MAX_ATTRIBUTE_TEXT] + "…"
