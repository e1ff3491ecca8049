"""A name a simplifier kept for a later value is not compared with its namesake.

onnxsim folds a BatchNormalization into the Conv before it and keeps the Conv's output
name for the folded result. Compared by name with the reference's Conv output, the
file was at parity with a hidden divergence "introduced" at the Conv (corpus seed 1023,
onnxsim on the dynamo export). The value the candidate's name holds is the
BatchNorm's output: that is what it is compared with.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import bisect_onnx
from bisect_onnx.align.kept_names import taken_over

RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((4, 3, 3)).astype(np.float32)
BIAS = RNG.standard_normal(4).astype(np.float32)
SCALE, SHIFT = RNG.uniform(0.5, 2, 4).astype(np.float32), RNG.standard_normal(4).astype(
    np.float32)
MEAN, VAR = RNG.standard_normal(4).astype(np.float32), RNG.uniform(0.5, 2, 4).astype(
    np.float32)


def _graph(nodes, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4, 14])],
        initializer=[numpy_helper.from_array(array, name)
                     for name, array in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _models(tmp_path):
    reference = _graph([
        helper.make_node("Conv", ["x", "w", "b"], ["conv1d"], name="node_conv1d"),
        helper.make_node("BatchNormalization", ["conv1d", "scale", "shift", "mean", "var"],
                         ["getitem"], name="node_batch_norm", epsilon=1e-5),
        helper.make_node("Neg", ["getitem"], ["out"], name="node_neg")],
        {"w": WEIGHT, "b": BIAS, "scale": SCALE, "shift": SHIFT, "mean": MEAN, "var": VAR})
    factor = SCALE / np.sqrt(VAR + 1e-5)
    folded = _graph([
        helper.make_node("Conv", ["x", "w2", "b2"], ["conv1d"], name="node_conv1d"),
        helper.make_node("Neg", ["conv1d"], ["out"], name="node_neg")],
        {"w2": WEIGHT * factor[:, None, None], "b2": (BIAS - MEAN) * factor + SHIFT})
    paths = tmp_path / "reference.onnx", tmp_path / "folded.onnx"
    for model, path in zip((reference, folded), paths, strict=True):
        onnx.save(model, str(path))
    return reference, folded, paths


def test_the_folded_conv_s_name_holds_the_batch_norm_s_value(tmp_path):
    reference, folded, _ = _models(tmp_path)
    assert taken_over(reference, folded) == {"conv1d": "getitem"}
    assert taken_over(reference, reference) == {}


def test_a_folded_batch_norm_is_parity_with_nothing_claimed(tmp_path):
    _, _, (reference, folded) = _models(tmp_path)
    x = RNG.standard_normal((2, 3, 16)).astype(np.float32)
    report = bisect_onnx.bisect_onnx_models(reference, folded, [x])
    assert report.verdict == "parity" and not report.hidden_divergences, report.summary()
    compared = {record.match.reference_value: record for record in report.comparisons}
    assert "conv1d" not in compared
    assert compared["getitem"].onnx_value == "conv1d" and not compared["getitem"].failed
    assert any(item.name == "conv1d" and "later one" in item.reason
               for item in report.unaligned)


def test_a_node_a_tool_dropped_leaves_the_value_before_it_compared_as_it_was(tmp_path):
    """The scale's Mul dropped (a bug), the Softmax reads the MatMul's output: the MatMul
    is unchanged, its value compared with its namesake, and the Softmax is named."""
    def model(nodes, initializers):
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])],
            initializer=[numpy_helper.from_array(array, name)
                         for name, array in initializers.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    weight = RNG.standard_normal((8, 8)).astype(np.float32)
    matmul = helper.make_node("MatMul", ["x", "w"], ["m"], name="node_mm")
    reference = model([matmul, helper.make_node("Mul", ["m", "c"], ["scaled"], name="node_mul"),
                       helper.make_node("Softmax", ["scaled"], ["out"], name="node_sm")],
                      {"w": weight, "c": np.array(0.125, np.float32)})
    dropped = model([matmul, helper.make_node("Softmax", ["m"], ["out"], name="node_sm")],
                    {"w": weight})
    assert taken_over(reference, dropped) == {}
    paths = tmp_path / "reference.onnx", tmp_path / "dropped.onnx"
    for proto, path in zip((reference, dropped), paths, strict=True):
        onnx.save(proto, str(path))
    x = RNG.standard_normal((2, 8)).astype(np.float32) * 4
    report = bisect_onnx.bisect_onnx_models(*paths, [x])
    assert report.culprit is not None and report.culprit.onnx_node == "node_sm", report.summary()
