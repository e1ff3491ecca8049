"""Tests for bisect_onnx.align.graph_description: the questions matching asks of one graph."""

from __future__ import annotations

import numpy as np

from bisect_onnx.align.graph_description import (
    UNKNOWN_SPEC,
    GraphDescription,
    ValueSpec,
    content_key,
    is_constant_node,
    output_at,
    producers,
    strip_omitted,
    walk_up,
)
from bisect_onnx.graph.nodes import NodeInfo


def node(op: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> NodeInfo:
    """A node read from no graph: its op, inputs and outputs."""
    return NodeInfo(0, op, op, outputs, None, inputs)


def chain(length: int) -> list[NodeInfo]:
    """``x -> v0 -> v1 -> ...``, one Relu per step."""
    names = ["x", *(f"v{i}" for i in range(length))]
    return [node("Relu", (names[i],), (names[i + 1],)) for i in range(length)]


def test_content_key_tells_apart_dtype_shape_and_bytes_only():
    a = np.arange(6, dtype=np.float32)
    assert content_key(a) == content_key(a.copy())
    strided = np.arange(12, dtype=np.float32)[::2]
    assert content_key(strided) == content_key(strided.copy())  # memory layout is irrelevant
    assert content_key(a) != content_key(a.reshape(2, 3))
    assert content_key(a) != content_key(a.astype(np.float64))
    assert content_key(a) != content_key(a + 1)


def test_walk_up_yields_upstream_values_and_stops_past_the_limit():
    nodes = chain(5)
    found = list(walk_up(["v4"], nodes, producers(nodes), through=lambda name: True, limit=5))
    assert found == ["v4", "v3", "v2", "v1", "v0", "x"]
    cut = list(walk_up(["v4"], nodes, producers(nodes), through=lambda name: True, limit=4))
    assert cut == ["v4", "v3", "v2", "v1", "v0", None]  # v0's producer is the fifth


def test_walk_up_does_not_pass_a_value_through_refuses():
    nodes = chain(4)
    found = list(walk_up(["v3"], nodes, producers(nodes), through=lambda name: name != "v1",
                         limit=10))
    assert found == ["v3", "v2", "v1"]


def test_small_helpers():
    dropout = node("Dropout", ("x", "", ""), ("y", ""))
    assert strip_omitted(dropout.inputs) == ("x",)
    assert strip_omitted(("", "b")) == ("", "b")  # only trailing omissions go
    assert output_at(dropout, 0) == "y" and output_at(dropout, 5) == ""
    constants = {"c": np.zeros(1)}
    assert is_constant_node(node("Constant", (), ("c",)), constants)
    assert not is_constant_node(node("Shape", ("x",), ("s",)), constants)
    assert not is_constant_node(node("Nothing", (), ("",)), constants)


def test_spec_fits_unknown_parts_and_a_description_defaults_to_unknown():
    known = ValueSpec((2, None), "float32")
    assert known.fits(ValueSpec((2, 7), None)) and known.fits(UNKNOWN_SPEC)
    assert not known.fits(ValueSpec((2, 7, 1), "float32"))
    assert not known.fits(ValueSpec((2, 7), "float16"))
    description = GraphDescription(nodes=[], inputs=[], specs={"a": known}, constants={})
    assert description.spec("a") is known and description.spec("b") is UNKNOWN_SPEC
