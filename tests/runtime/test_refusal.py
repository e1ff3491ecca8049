"""ONNX Runtime's refusal to run a model, read for the node it names."""

from __future__ import annotations

from bisect_onnx.errors import ModelError, RuntimeRefused
from bisect_onnx.runtime.onnxruntime.sessions import refusal

GEMM = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while "
        "running Gemm node. Name:'/fc/Gemm' Status Message: GEMM: Dimension mismatch, "
        "W: {3,8} K: 24 N:3")
ADD = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Add "
       "node. Name:'/Add' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/"
       "math/element_wise_ops.h:563 void onnxruntime::BroadcastIterator::Init(ptrdiff_t, "
       "ptrdiff_t) axis == 1 || axis == largest was false. Attempting to broadcast an axis "
       "by a dimension other than 1. 3 by 5")


def test_the_node_and_the_runtime_s_own_reason_are_read():
    error = refusal("ONNX Runtime failed to run m.onnx", RuntimeError(GEMM))
    assert isinstance(error, ModelError) and error.exit_code == 3
    assert (error.node, error.op_type) == ("/fc/Gemm", "Gemm")
    assert error.reason == "GEMM: Dimension mismatch, W: {3,8} K: 24 N:3"
    assert str(error).startswith("ONNX Runtime failed to run m.onnx: [ONNXRuntimeError]")


def test_the_c_plus_plus_source_and_function_are_left_out_of_the_reason():
    error = refusal("ONNX Runtime failed to run m.onnx", RuntimeError(ADD))
    assert error.node == "/Add"
    assert error.reason.startswith("axis == 1 || axis == largest was false. Attempting")


def test_a_failure_naming_no_node_keeps_its_message():
    error = refusal("ONNX Runtime failed to run m.onnx", RuntimeError("out of memory"))
    assert isinstance(error, RuntimeRefused) and error.node is None
    assert str(error) == "ONNX Runtime failed to run m.onnx: out of memory"
