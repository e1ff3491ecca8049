"""The QDQ exclusion search on a quantize_static model with one weight scale planted wrong."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.fixes.precision_rerun import run_model
from bisect_onnx.fixes.qdq_fix import find_nodes_to_exclude
from bisect_onnx.fixes.qdq_strip import without_qdq
from bisect_onnx.fixes.trial import output_figures
from bisect_onnx.judge.tolerances import PRECISION_DEFAULTS, QUANTIZED, quantized_tolerance


def _float_and_qdq(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    rng = np.random.default_rng(0)
    n = helper.make_node
    weights = {name: rng.normal(0, 0.3, shape).astype(np.float32)
               for name, shape in [("w1", (16, 16)), ("w2", (16, 16)), ("b", (16,))]}
    graph = helper.make_graph(
        [n("MatMul", ["x", "w1"], ["h"], name="mm1"), n("Relu", ["h"], ["r"], name="relu"),
         n("MatMul", ["r", "w2"], ["z"], name="mm2"), n("Add", ["z", "b"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w, k) for k, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "float.onnx")
    samples = [rng.normal(0, 1, (4, 16)).astype(np.float32) for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": x} for x in samples])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ)
    return model, onnx.load(tmp_path / "qdq.onnx"), {"x": samples[0]}


def test_a_wrong_weight_scale_names_its_node(tmp_path):
    reference, qdq, inputs = _float_and_qdq(tmp_path)
    for tensor in qdq.graph.initializer:
        if tensor.name == "w2_scale":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 8, tensor.name))
    # The tolerance a run gives a QDQ candidate's output against its float reference.
    scale = next(float(numpy_helper.to_array(t)) for t in qdq.graph.initializer
                 if t.name == "y_scale")
    tolerance = quantized_tolerance(PRECISION_DEFAULTS[QUANTIZED], scale)
    [fix] = find_nodes_to_exclude(reference, qdq, inputs, tolerance=tolerance)
    assert not fix.before.passes and fix.reaches_parity
    assert fix.details["nodes_to_exclude"] == ["mm2"]
    fixed = onnx.load_from_string(fix.fixed_model)
    assert output_figures(run_model(reference, inputs), run_model(fixed, inputs),
                          rtol=tolerance.rtol, atol=tolerance.atol).passes


def test_stripping_keeps_the_relu_folded_into_the_quantizer(tmp_path):
    # quantize_static drops the Relu after mm1 (its quantizer's range starts at 0).
    reference, qdq, inputs = _float_and_qdq(tmp_path)
    assert "Relu" not in {node.op_type for node in qdq.graph.node}
    stripped = without_qdq(qdq, ["mm1", "mm2", "add"], reference)
    onnx.checker.check_model(stripped)  # the added Clip sits in topological order
    want, got = run_model(reference, inputs), run_model(stripped, inputs)
    assert np.abs(got[0] - want[0]).max() < np.abs(want[0]).max() * 0.05


def test_a_qdq_culprit_is_framed_as_quantization_and_its_checked_fix_named(tmp_path):
    import bisect_onnx
    from bisect_onnx.report.verdict import verdict_line

    reference, qdq, inputs = _float_and_qdq(tmp_path)
    for tensor in qdq.graph.initializer:
        if tensor.name == "w2_scale":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 8, tensor.name))
    unchecked = verdict_line(bisect_onnx.bisect_onnx_models(reference, qdq, inputs))
    assert "computes in int8 (QDQ)" in unchecked and "--suggest-fix finds the nodes" in unchecked
    assert "exporter" not in unchecked.splitlines()[0]
    checked = bisect_onnx.bisect_onnx_models(reference, qdq, inputs, suggest_fix=True)
    headline = verdict_line(checked).splitlines()[0]
    assert "the quantization is the cause: leave 1 of 3 nodes unquantized: mm2" in headline
