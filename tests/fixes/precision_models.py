"""Small float32 models, built by hand, whose float16/bfloat16 forms go wrong in one place.

ONNX Runtime's CPU provider has no float16 kernel for most arithmetic: it computes runs of
such nodes in float32 between Casts, so a LayerNorm or Softmax reduction does not overflow
there (it would in a GPU kernel). What float16 changes on CPU is what it stores: the
weights. The planted cases are a weight past 65504 (clamped by the converter) and two
nearly equal products whose difference float16 weights cannot resolve.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 32


def _model(nodes, weights) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "planted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, WIDTH])],
        [numpy_helper.from_array(w, name) for name, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": (np.eye(WIDTH) + rng.normal(0, 0.01, (WIDTH, WIDTH))).astype(np.float32),
            "w2": rng.normal(0, 0.2, (WIDTH, WIDTH)).astype(np.float32)}


def large_weight_model() -> onnx.ModelProto:
    """An activation scaled up by 1e5 (past float16's 65504) and back down by 1e-5."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"], name="proj_in"),
             n("Mul", ["h", "up"], ["scaled"], name="scale_up"),
             n("Mul", ["scaled", "down"], ["back"], name="scale_down"),
             n("MatMul", ["back", "w2"], ["z"], name="proj_out"),
             n("Relu", ["z"], ["y"], name="act")]
    weights = _weights(2) | {"up": np.array(1e5, np.float32), "down": np.array(1e-5, np.float32)}
    return _model(nodes, weights)


def cancellation_model() -> onnx.ModelProto:
    """x @ a - x @ b with a and b equal to 1e-4: a 16-bit weight cannot hold the gap."""
    n = helper.make_node
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, (WIDTH, WIDTH)).astype(np.float32)
    b = (a + rng.normal(0, 1e-3, a.shape)).astype(np.float32)
    nodes = [n("MatMul", ["x", "w1"], ["h"], name="proj_in"),
             n("MatMul", ["h", "a"], ["ha"], name="branch_a"),
             n("MatMul", ["h", "b"], ["hb"], name="branch_b"),
             n("Sub", ["ha", "hb"], ["gap"], name="gap"),
             n("MatMul", ["gap", "w2"], ["z"], name="proj_out"),
             n("Relu", ["z"], ["y"], name="act")]
    return _model(nodes, _weights(4) | {"a": a, "b": b})


def to_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every weight in bfloat16, Cast to float32 where read (ORT CPU runs it)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    casts = []
    for tensor in copy.graph.initializer:
        if tensor.data_type != TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(tensor)
        low = helper.make_tensor(f"{tensor.name}__bf16", TensorProto.BFLOAT16, values.shape,
                                 values.ravel().tolist())
        copy.graph.initializer.append(low)
        casts.append(helper.make_node("Cast", [low.name], [tensor.name], to=TensorProto.FLOAT,
                                      name=f"{tensor.name}__cast"))
    names = {c.output[0] for c in casts}
    kept = [t for t in copy.graph.initializer if t.name not in names]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    nodes = [*casts, *copy.graph.node]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
