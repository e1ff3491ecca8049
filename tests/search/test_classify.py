"""Which side is wrong: graph semantics, runtime kernel or float precision.

The decision is tested on synthetic arrays; the float64 runners on tiny ONNX models
built inline and tiny ``torch.export`` programs, with ONNX Runtime's real values.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.search.classify import Classification, Kind, classify
from bisect_onnx.search.float64_reruns import onnx_segment_in_float64, torch_op_in_float64

RTOL, ATOL = 1e-3, 1e-5


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "segment", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float_input(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _run_ort(model: onnx.ModelProto, feeds) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))[0]


@dataclass(frozen=True)
class Exported:
    """A tiny module exported with torch.export, and what PyTorch computed."""

    program: torch.export.ExportedProgram
    values: dict[str, np.ndarray]
    """The inputs' values by FX node name."""
    op: torch.fx.Node
    """The first op node."""
    torch32: np.ndarray
    """The module's output in float32."""


def _exported(module: torch.nn.Module, *inputs: np.ndarray) -> Exported:
    tensors = tuple(torch.from_numpy(array) for array in inputs)
    program = torch.export.export(module.eval(), tensors)
    values = dict(zip(program.graph_signature.user_inputs, inputs, strict=True))
    with torch.no_grad():
        torch32 = module(*tensors).numpy()
    op = next(node for node in program.graph.nodes if node.op == "call_function")
    return Exported(program, values, op, torch32)


def test_importing_loads_neither_torch_nor_onnx():
    code = ("import sys, bisect_onnx.search.classify, bisect_onnx.search.float64_reruns; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


# -- classify(): the decision alone -------------------------------------------------------


def _truth() -> np.ndarray:
    return _rng().standard_normal((4, 16))


def test_float64_disagreement_is_graph_semantics():
    truth = _truth()
    verdict = classify(torch64=truth, onnx64=truth * 1.01, torch32=truth.astype(np.float32),
                       ort32=(truth * 1.01).astype(np.float32), rtol=RTOL, atol=ATOL)
    assert verdict.kind == Kind.GRAPH_SEMANTICS
    assert verdict.torch_vs_onnx64 == pytest.approx(np.abs(truth * 0.01).max())
    assert "pytorch/pytorch" in verdict.file_with
    assert "\n" not in verdict.detail


def test_ort_far_from_agreeing_float64_values_is_runtime_kernel():
    truth = _truth()
    ort32 = truth.astype(np.float32)
    ort32[1, 3] += 0.05
    verdict = classify(torch64=truth, onnx64=truth.copy(), torch32=truth.astype(np.float32),
                       ort32=ort32, rtol=RTOL, atol=ATOL)
    assert verdict.kind == Kind.RUNTIME_KERNEL
    assert verdict.ort_error == pytest.approx(0.05, rel=1e-3)
    assert verdict.torch_error < 1e-6
    assert "microsoft/onnxruntime" in verdict.file_with


def test_ort_error_like_torchs_own_is_float_precision():
    truth = _truth()
    torch32 = truth.astype(np.float32)
    ort32 = np.nextafter(torch32, np.float32(np.inf))  # one rounding off, the other way
    verdict = classify(torch64=truth, onnx64=truth.copy(), torch32=torch32, ort32=ort32,
                       rtol=1e-7, atol=0.0)
    assert verdict.kind == Kind.FLOAT_PRECISION
    assert verdict.file_with.startswith("no bug:")
    assert "loosen the tolerance to atol=" in verdict.file_with


def test_ort_nan_where_the_truth_is_finite_is_runtime_kernel():
    truth = _truth()
    ort32 = truth.astype(np.float32)
    ort32[0, 0] = np.nan
    verdict = classify(torch64=truth, onnx64=truth.copy(), torch32=truth.astype(np.float32),
                       ort32=ort32, rtol=RTOL, atol=ATOL)
    assert verdict.kind == Kind.RUNTIME_KERNEL
    assert verdict.ort_error == np.inf


def test_exact_float32_values_are_not_a_kernel_bug_for_one_rounding():
    # Small integers: PyTorch's float32 is exact, so "10x its error" alone would be 0.
    truth = np.arange(8, dtype=np.float64)
    ort32 = np.nextafter(truth.astype(np.float32), np.float32(np.inf))
    verdict = classify(torch64=truth, onnx64=truth.copy(), torch32=truth.astype(np.float32),
                       ort32=ort32, rtol=0.0, atol=0.0)
    assert verdict.torch_error == 0.0
    assert verdict.kind == Kind.FLOAT_PRECISION


@pytest.mark.parametrize("missing", ["torch64", "onnx64", "both"])
def test_a_missing_float64_value_is_unclassified(missing):
    truth = _truth()
    arrays = {"torch64": truth, "onnx64": truth.copy()}
    for name in (("torch64", "onnx64") if missing == "both" else (missing,)):
        arrays[name] = None
    verdict = classify(**arrays, torch32=truth.astype(np.float32),
                       ort32=truth.astype(np.float32), rtol=RTOL, atol=ATOL)
    assert verdict == Classification(Kind.UNCLASSIFIED, verdict.detail, verdict.file_with,
                                     None, None, None)
    said = {"torch64": "torch op", "onnx64": "ONNX segment"}
    for name, phrase in said.items():
        assert (phrase in verdict.detail) == (missing in (name, "both"))


# -- end to end on tiny models --------------------------------------------------------------


def test_avg_pool_divisor_override_is_graph_semantics():
    class Pool(torch.nn.Module):
        def forward(self, x):
            return F.avg_pool2d(x, 2, divisor_override=3)

    x = _rng().standard_normal((1, 2, 4, 4)).astype(np.float32)
    exported = _exported(Pool(), x)
    pool = _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                                    strides=[2, 2])],
                  [_float_input("x", [1, 2, 4, 4])], [_float_input("y", [1, 2, 2, 2])])

    torch64 = torch_op_in_float64(exported.op, exported.program, exported.values)
    onnx64 = onnx_segment_in_float64(pool, {"x": x}, "y")
    verdict = classify(torch64=torch64, onnx64=onnx64, torch32=exported.torch32,
                       ort32=_run_ort(pool, {"x": x}), rtol=RTOL, atol=ATOL)

    assert verdict.kind == Kind.GRAPH_SEMANTICS, verdict.detail
    # Dividing by 4 instead of 3: three quarters of the value, in float64.
    np.testing.assert_allclose(onnx64, torch64 * 3 / 4, rtol=1e-12)


def test_conv_with_a_scaled_weight_is_graph_semantics():
    conv = torch.nn.Conv2d(2, 3, 3)
    x = _rng().standard_normal((1, 2, 5, 5)).astype(np.float32)
    exported = _exported(conv, x)
    weight = conv.weight.detach().numpy() * np.float32(1.01)
    bias = conv.bias.detach().numpy()
    edited = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"])],
                    [_float_input("x", [1, 2, 5, 5])], [_float_input("y", [1, 3, 3, 3])],
                    [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])

    verdict = classify(torch64=torch_op_in_float64(exported.op, exported.program,
                                                   exported.values),
                       onnx64=onnx_segment_in_float64(edited, {"x": x}, "y"),
                       torch32=exported.torch32, ort32=_run_ort(edited, {"x": x}),
                       rtol=RTOL, atol=ATOL)

    assert verdict.kind == Kind.GRAPH_SEMANTICS, verdict.detail
    assert verdict.torch_vs_onnx64 > 1e-3


@dataclass(frozen=True)
class LinearCase:
    """nn.Linear exported, and a faithful MatMul+Add segment of it."""

    linear: torch.nn.Linear
    x: np.ndarray
    exported: Exported
    segment: onnx.ModelProto

    def torch64(self) -> np.ndarray:
        return torch_op_in_float64(self.exported.op, self.exported.program, self.exported.values)

    def onnx64(self) -> np.ndarray:
        return onnx_segment_in_float64(self.segment, {"x": self.x}, "y")

    def ort32(self) -> np.ndarray:
        return _run_ort(self.segment, {"x": self.x})


@pytest.fixture(scope="module")
def linear_case() -> LinearCase:
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 32)
    x = _rng().standard_normal((64, 256)).astype(np.float32)
    segment = _model(
        [helper.make_node("MatMul", ["x", "wt"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["y"])],
        [_float_input("x", [64, 256])], [_float_input("y", [64, 32])],
        [numpy_helper.from_array(linear.weight.detach().numpy().T.copy(), "wt"),
         numpy_helper.from_array(linear.bias.detach().numpy(), "b")])
    return LinearCase(linear, x, _exported(linear, x), segment)


def test_faithful_linear_at_a_float64_tolerance_is_float_precision(linear_case):
    rtol, atol = 1e-7, 0.0
    torch64, torch32, ort32 = (linear_case.torch64(), linear_case.exported.torch32,
                               linear_case.ort32())
    for float32 in (torch32, ort32):
        assert not compare_arrays(torch64, float32.astype(np.float64), rtol=rtol,
                                  atol=atol).passed, "float32 rounding should fail this tolerance"

    verdict = classify(torch64=torch64, onnx64=linear_case.onnx64(), torch32=torch32,
                       ort32=ort32, rtol=rtol, atol=atol)

    assert verdict.kind == Kind.FLOAT_PRECISION, verdict.detail
    assert verdict.torch_vs_onnx64 < 1e-12
    assert 0 < verdict.ort_error < 1e-4


def test_a_perturbed_ort_value_on_a_faithful_segment_is_runtime_kernel(linear_case):
    buggy = linear_case.ort32()
    buggy[7, 5] += 0.25  # what a broken kernel would return

    verdict = classify(torch64=linear_case.torch64(), onnx64=linear_case.onnx64(),
                       torch32=linear_case.exported.torch32, ort32=buggy, rtol=RTOL, atol=ATOL)

    assert verdict.kind == Kind.RUNTIME_KERNEL, verdict.detail
    assert verdict.ort_error > 10 * verdict.torch_error


# -- torch_op_in_float64 -------------------------------------------------------------------


def test_torch_op_in_float64_reads_the_parameters_from_the_program(linear_case):
    weight, bias = (linear_case.linear.weight.detach().numpy().astype(np.float64),
                    linear_case.linear.bias.detach().numpy().astype(np.float64))
    by_hand = linear_case.x.astype(np.float64) @ weight.T + bias

    torch64 = linear_case.torch64()

    assert torch64.dtype == np.float64
    np.testing.assert_allclose(torch64, by_hand, rtol=1e-12, atol=1e-12)
    # Computed in float64, not promoted afterwards: float32's own result is much further off.
    float32_error = np.abs(linear_case.exported.torch32 - by_hand).max()
    assert float32_error > 1e3 * np.abs(torch64 - by_hand).max()


def test_torch_op_in_float64_is_none_for_an_unresolvable_argument(linear_case, caplog):
    exported = linear_case.exported
    activation = exported.op.args[0].name
    without_input = {name: value for name, value in exported.values.items()
                     if name != activation}
    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.search.float64_reruns"):
        assert torch_op_in_float64(exported.op, exported.program, without_input) is None
    assert f"argument {activation} has no reference array" in caplog.text


def test_torch_op_in_float64_is_none_for_a_non_float_result():
    class ArgMax(torch.nn.Module):
        def forward(self, x):
            return x.argmax(1)

    exported = _exported(ArgMax(), _rng().standard_normal((2, 5)).astype(np.float32))
    assert torch_op_in_float64(exported.op, exported.program, exported.values) is None


def test_torch_op_in_float64_makes_dtype_arguments_float64_too():
    class Half(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float16)

    x = np.asarray([1 / 3, 1e-5 + 1], dtype=np.float32)
    exported = _exported(Half(), x)
    to = next(node for node in exported.program.graph.nodes
              if node.target is torch.ops.aten.to.dtype)
    np.testing.assert_array_equal(torch_op_in_float64(to, exported.program, exported.values),
                                  x.astype(np.float64))


def test_torch_op_in_float64_reruns_the_op_a_getitem_picks_from():
    class Variance(torch.nn.Module):
        def forward(self, x):
            return torch.var_mean(x, dim=1)[0]

    x = _rng().standard_normal((3, 50)).astype(np.float32)
    exported = _exported(Variance(), x)
    getitem = next(node for node in exported.program.graph.nodes
                   if node.name.startswith("getitem"))
    np.testing.assert_allclose(torch_op_in_float64(getitem, exported.program, exported.values),
                               x.astype(np.float64).var(axis=1, ddof=1), rtol=1e-12)


# -- onnx_segment_in_float64 ---------------------------------------------------------------


def test_onnx_segment_in_float64_keeps_casts_to_float_in_double():
    # y = -Cast<float>(x / 3): in float32 the cast rounds x / 3, in float64 it must not.
    x = np.asarray([1.0, 2.0, 5.0, 7.0], dtype=np.float32)
    segment = _model(
        [helper.make_node("Constant", [], ["three"], value_float=3.0),
         helper.make_node("Div", ["x", "three"], ["third"]),
         helper.make_node("Cast", ["third"], ["third32"], to=TensorProto.FLOAT),
         helper.make_node("Neg", ["third32"], ["y"])],
        [_float_input("x", [4])], [_float_input("y", [4])])
    before = segment.SerializeToString()

    onnx64 = onnx_segment_in_float64(segment, {"x": x}, "y")

    assert onnx64.dtype == np.float64
    np.testing.assert_array_equal(onnx64, -(x.astype(np.float64) / 3))
    assert not np.array_equal(onnx64, -(x / np.float32(3)).astype(np.float64)), \
        "the test values must show float32 rounding"
    assert segment.SerializeToString() == before, "the caller's model was changed"


def test_onnx_segment_in_float64_evaluates_an_intermediate_value():
    x = np.asarray([0.1, 0.2], dtype=np.float32)
    segment = _model([helper.make_node("Mul", ["x", "x"], ["square"]),
                      helper.make_node("Neg", ["square"], ["y"])],
                     [_float_input("x", [2])], [_float_input("y", [2])])
    np.testing.assert_array_equal(onnx_segment_in_float64(segment, {"x": x}, "square"),
                                  x.astype(np.float64) ** 2)


def test_onnx_segment_in_float64_is_none_for_a_contrib_op(caplog):
    fused = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft",
                             activation="Relu")
    graph = helper.make_graph([fused], "segment", [_float_input("x", [1, 1, 3, 3])],
                              [_float_input("y", [1, 1, 3, 3])],
                              initializer=[numpy_helper.from_array(
                                  np.ones((1, 1, 1, 1), np.float32), "w")])
    segment = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                      helper.make_opsetid("com.microsoft", 1)])
    x = np.ones((1, 1, 3, 3), np.float32)
    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.search.float64_reruns"):
        assert onnx_segment_in_float64(segment, {"x": x}, "y") is None
    assert "FusedConv" in caplog.text


def test_onnx_segment_in_float64_is_none_for_weights_kept_outside(caplog):
    weight = numpy_helper.from_array(np.ones(2, np.float32), "w")
    set_external_data(weight, location="weights.bin")
    weight.data_location = TensorProto.EXTERNAL
    segment = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_float_input("x", [2])],
                     [_float_input("y", [2])], [weight])
    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.search.float64_reruns"):
        assert onnx_segment_in_float64(segment, {"x": np.ones(2, np.float32)}, "y") is None
    assert "weight 'w' keeps its data outside the model" in caplog.text
