"""Unit tests for bisect_onnx.align.modules.align_modules on hand-built captures and nodes."""

from __future__ import annotations

import numpy as np

from bisect_onnx.align.modules import NO_METADATA, NO_NODE, align_modules
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import Provenance, TorchMetadata
from bisect_onnx.runtime.sides import Capture, CapturedValue


def reference(*calls: tuple[str, str, int]) -> Capture:
    """A PyTorch-side capture from ``(value name, module path, call)`` triples."""
    values = {
        name: CapturedValue(name, np.full(2, float(position), np.float32),
                            Provenance(position=position, module=module, call=call))
        for position, (name, module, call) in enumerate(calls)
    }
    return Capture(values=values, outputs=[])


def node(index: int, scopes: tuple[str, ...] | None, fx_node: str | None,
         outputs: tuple[str, ...] | None = None, op: str = "Relu") -> NodeInfo:
    """An ONNX node; ``scopes=None`` means the node carries no torch metadata."""
    meta = None if scopes is None else TorchMetadata(scopes=scopes, fx_node=fx_node,
                                                    torch_op=None, source=None)
    return NodeInfo(index=index, name=f"node_{index}", op_type=op,
                    outputs=outputs or (f"out_{index}",), torch=meta)


def candidates(nodes, shapes=None) -> dict[str, CapturedValue]:
    """One ONNX value per node output, shaped (2,) float32 unless ``shapes`` says otherwise."""
    shapes = shapes or {}
    values = {}
    for info in nodes:
        for output in info.outputs:
            array = np.zeros(shapes.get(output, (2,)), np.float32)
            values[output] = CapturedValue(output, array, Provenance(
                position=len(values), node=info.name, node_op=info.op_type))
    return values


def paired(alignment) -> dict[str, str]:
    return {pair.reference.name: pair.candidate.name for pair in alignment.pairs}


def reasons(alignment) -> dict[str, str]:
    return {item.name: item.reason for item in alignment.unaligned}


def test_distinct_modules_pair_with_their_nodes():
    ref = reference(("fc", "fc", 0), ("act", "act", 0))
    nodes = [node(0, ("", "fc"), "linear"), node(1, ("", "act"), "relu")]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"fc": "out_0", "act": "out_1"}
    assert alignment.unaligned == []
    assert alignment.module_calls == 2
    assert alignment.aligned_calls == 2


def test_reused_module_pairs_each_call_with_its_own_node_in_graph_order():
    ref = reference(("relu", "relu", 0), ("fc", "fc", 0), ("relu@1", "relu", 1))
    nodes = [
        node(0, ("", "relu"), "relu"),
        node(1, ("", "fc"), "linear"),
        node(2, ("", "relu"), "relu_1"),
    ]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"relu": "out_0", "fc": "out_1", "relu@1": "out_2"}
    assert alignment.module_calls == 3
    assert alignment.aligned_calls == 3


def test_reused_block_with_several_ops_per_call_takes_each_calls_last_value():
    ref = reference(("block", "block", 0), ("block@1", "block", 1))
    nodes = [
        node(0, ("", "block"), "linear"),
        node(1, ("", "block"), "tanh"),
        node(2, ("", "block"), "linear_1"),
        node(3, ("", "block"), "tanh_1"),
    ]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"block": "out_1", "block@1": "out_3"}


def test_call_index_assigns_calls_even_against_graph_order():
    ref = reference(("relu", "relu", 0), ("relu@1", "relu", 1))
    nodes = [node(0, ("", "relu"), "relu"), node(1, ("", "relu"), "relu_1")]
    call_index = {"relu": {"relu": 1}, "relu_1": {"relu": 0}}
    alignment = align_modules(ref, nodes, candidates(nodes), call_index=call_index)
    assert paired(alignment) == {"relu": "out_1", "relu@1": "out_0"}


def test_call_index_missing_a_node_falls_back_to_graph_order():
    ref = reference(("relu", "relu", 0), ("relu@1", "relu", 1))
    nodes = [node(0, ("", "relu"), "relu"), node(1, ("", "relu"), "relu_1")]
    call_index = {"relu": {"relu": 1}}  # relu_1 unknown: the index cannot be trusted
    alignment = align_modules(ref, nodes, candidates(nodes), call_index=call_index)
    assert paired(alignment) == {"relu": "out_0", "relu@1": "out_1"}


def test_call_index_resolves_a_count_graph_order_cannot_split():
    ref = reference(("block", "block", 0), ("block@1", "block", 1))
    nodes = [node(0, ("", "block"), "a"), node(1, ("", "block"), "b"),
             node(2, ("", "block"), "c")]
    call_index = {"a": {"block": 0}, "b": {"block": 1}, "c": {"block": 1}}
    alignment = align_modules(ref, nodes, candidates(nodes), call_index=call_index)
    assert paired(alignment) == {"block": "out_0", "block@1": "out_2"}


def test_indivisible_op_count_for_a_reused_module_is_left_unaligned():
    ref = reference(("block", "block", 0), ("block@1", "block", 1))
    nodes = [node(0, ("", "block"), "a"), node(1, ("", "block"), "b"),
             node(2, ("", "block"), "c")]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert alignment.pairs == []
    found = reasons(alignment)
    assert set(found) == {"block", "block@1"}
    assert all("do not split into 2 alike runs" in reason for reason in found.values())


def test_module_without_any_node_is_unaligned_with_a_reason():
    ref = reference(("conv", "conv", 0), ("bn", "bn", 0))
    nodes = [node(0, ("", "bn"), "conv2d", op="Conv")]  # the fused Conv carries bn's scope
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"bn": "out_0"}
    assert reasons(alignment) == {"conv": NO_NODE}
    assert alignment.aligned_calls == 1
    assert alignment.module_calls == 2


def test_nodes_without_torch_metadata_leave_everything_unaligned():
    ref = reference(("fc", "fc", 0), ("act", "act", 0))
    nodes = [node(0, None, None), node(1, None, None)]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert alignment.pairs == []
    assert reasons(alignment) == {"fc": NO_METADATA, "act": NO_METADATA}
    assert alignment.module_calls == 2


def test_module_returning_a_tuple_is_unaligned():
    ref = reference(("split[0]", "split", 0), ("split[1]", "split", 0), ("act", "act", 0))
    nodes = [node(0, ("", "split"), "split", outputs=("s0", "s1"), op="Split"),
             node(1, ("", "act"), "relu")]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"act": "out_1"}
    found = reasons(alignment)
    assert set(found) == {"split[0]", "split[1]"}
    assert all("returns 2 tensors" in reason for reason in found.values())


def test_parent_module_output_is_the_last_value_of_its_children():
    ref = reference(("block.linear", "block.linear", 0), ("block.tanh", "block.tanh", 0),
                    ("block", "block", 0))
    nodes = [node(0, ("", "block", "block.linear"), "linear"),
             node(1, ("", "block", "block.tanh"), "tanh")]
    alignment = align_modules(ref, nodes, candidates(nodes))
    assert paired(alignment) == {"block.linear": "out_0", "block.tanh": "out_1",
                                 "block": "out_1"}


def test_multi_output_node_gives_the_output_shaped_like_the_reference():
    ref = reference(("norm", "norm", 0))
    nodes = [node(0, ("", "norm"), "layer_norm", outputs=("mean", "normed"),
                  op="LayerNormalization")]
    alignment = align_modules(ref, nodes, candidates(nodes, shapes={"mean": (1,)}))
    assert paired(alignment) == {"norm": "normed"}


def test_node_outputs_missing_from_the_candidate_fall_back_to_an_earlier_node():
    ref = reference(("block", "block", 0))
    nodes = [node(0, ("", "block"), "linear"),
             node(1, ("", "block"), "const", outputs=("folded",), op="Constant")]
    values = candidates(nodes)
    del values["folded"]  # Constant outputs are not promoted
    alignment = align_modules(ref, nodes, values)
    assert paired(alignment) == {"block": "out_0"}
